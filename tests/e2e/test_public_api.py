"""The public API exactly as docs/library.md shows it: every public name there after importing every
submodule, and the document's code block run as shown."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


LIBRARY_DOC = Path(__file__).resolve().parents[2] / "docs" / "library.md"


def test_every_public_name_after_importing_every_submodule():
    code = """
import importlib, pkgutil, types
import torch
import torchrepro
for m in pkgutil.walk_packages(torchrepro.__path__, "torchrepro."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
import torchrepro as tr
for name in tr.__all__:
    value = getattr(tr, name)
    assert value is not None, name
    if name not in ("checkpoint", "rng"):
        assert not isinstance(value, types.ModuleType), name
assert set(tr.__all__) >= {"seed_everything", "RngState", "deterministic", "fingerprint", "checkpoint", "rng"}
tr.seed_everything(1)
model = torch.nn.Linear(2, 2)
assert len(tr.fingerprint(model)) == 32 and tr.fingerprints(model)["weight"]
assert tr.checkpoint.plan().resume_from is None and callable(tr.rng.register)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_library_doc_block_runs_as_shown(tmp_path):
    block = re.search(r"## The API in one block\n.*?```python\n(.*?)```", LIBRARY_DOC.read_text(), re.S).group(1)
    proc = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 5
