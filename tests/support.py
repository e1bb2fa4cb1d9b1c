"""What tests import besides fixtures: reports checked against their schemas, the CLI in a child
process, and the xdist groups of the shared ``noise_check`` and ``bit_exact_check`` runs (tests/e2e/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import jsonschema

_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}
_LARGEST_REPORT = 64 << 20


def schema_problems(path: Path) -> list[str]:
    """Where the torchrepro report in ``path`` breaks the schema of its kind (empty when it
    validates, or when ``path`` holds no torchrepro report)."""
    import json

    from torchrepro.reports.loader import report_kind
    from torchrepro.reports.schema import schema_path

    try:
        if not path.is_file() or path.stat().st_size > _LARGEST_REPORT:
            return []
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # unreadable on purpose (hostile-input tests), or not JSON
        return []
    kind = report_kind(data)
    if kind is None:
        return []
    if kind not in _VALIDATORS:
        schema = json.loads(schema_path(kind).read_text())
        _VALIDATORS[kind] = jsonschema.Draft202012Validator(schema)
    errors = sorted(_VALIDATORS[kind].iter_errors(data), key=lambda e: list(e.absolute_path))
    return [f"{kind} report at /{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:5]]


# Runs that several tests only read, made once. A session fixture is made once per xdist worker:
# the tests reading one share a worker through an xdist_group (make test runs --dist loadgroup).
NOISE_CHECK_GROUP = "html-browser"
BIT_EXACT_CHECK_GROUP = "report_model"  # the ``bit_exact_check`` run


def run_torchrepro(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600, log: Path | None = None
):
    """``python -m torchrepro ARGS`` in ``cwd`` (``env``: added to ours), its output as text (``log``:
    its stdout and stderr into that file instead, as ``torchrepro ... > log 2>&1``)."""
    import subprocess

    with open(log, "w") if log else contextlib.nullcontext() as out:
        return subprocess.run(
            [sys.executable, "-m", "torchrepro", *args],
            cwd=cwd,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=timeout,
            **({"stdout": out, "stderr": subprocess.STDOUT} if out else {"capture_output": True}),
        )


def save_a_graph(folder: Path, compile_id: str = "0/0", differing: bool = False) -> Path:
    """A compiled graph saved as a run's probe saves one (``capture.graph_probe.save_graph``) in
    ``folder``: aten.gelu of a 64 x 8 input; its probe record says it differed when ``differing``."""
    import torch

    from torchrepro.capture.graph_probe import GraphProbe, _Call, save_graph

    class Gelu(torch.nn.Module):
        def forward(self, x):
            return (torch.ops.aten.gelu.default(x),)

    gm = torch.fx.symbolic_trace(Gelu())
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    call = _Call(compile_id, "forward", lambda args: gm(*args), [x], torch.random.get_rng_state(), [])
    said = {"repeats": 4, "runs_differing": 2, "differing": [0]} if differing else {"repeats": 2}
    save_graph(folder, gm, call, GraphProbe(compile_id=compile_id, graph="forward", threads=1, **said))
    return folder
