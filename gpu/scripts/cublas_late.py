"""The cuBLAS workspace audit where only a live process can tell: torchrepro.deterministic() called
before and after CUDA is initialised, with CUBLAS_WORKSPACE_CONFIG unset in the shell. Prints one
JSON line: the audit's CUBLAS_WORKSPACE_CONFIG row each time, the warnings, and whether two
deterministic matmuls repeat bit for bit.
"""

import json
import os
import warnings

import torch

from torchrepro import audit, deterministic

if not torch.cuda.is_available():
    raise SystemExit("cublas_late.py: no CUDA device")
if "CUBLAS_WORKSPACE_CONFIG" in os.environ:
    raise SystemExit("cublas_late.py: run it with CUBLAS_WORKSPACE_CONFIG unset")


def row() -> dict:
    (switch,) = [s for s in audit() if s.name == "CUBLAS_WORKSPACE_CONFIG"]
    return {"value": switch.value, "status": switch.status, "note": switch.note}


out = {"unset": row()}
with warnings.catch_warnings(record=True) as early:
    warnings.simplefilter("always")
    with deterministic():
        out["before_init"] = row()  # set before CUDA initialisation: in effect
        a = torch.randn(512, 512, device="cuda")
        out["matmul_repeats"] = bool(torch.equal(a @ a, a @ a))
out["before_init_warnings"] = [f"{w.category.__name__}: {w.message}" for w in early]
with warnings.catch_warnings(record=True) as late:
    warnings.simplefilter("always")
    with deterministic():  # CUDA is initialised now: the variable may not reach cuBLAS
        out["after_init"] = row()
out["after_init_warnings"] = [f"{w.category.__name__}: {w.message}" for w in late]
print(json.dumps(out))
