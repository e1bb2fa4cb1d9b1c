"""Shared test setup: one inductor cache for the whole run (cold compiles cost 10-20 s)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Set before anything imports torch._inductor; subprocesses started by tests inherit it.
_CACHE = Path(tempfile.gettempdir()) / f"torchrepro-test-inductor-{os.getuid()}"
_CACHE.mkdir(mode=0o700, exist_ok=True)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_CACHE))

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_python(tmp_path):
    """Run a Python snippet in a fresh interpreter; returns the CompletedProcess."""
    import subprocess

    def run(code: str, *, env: dict[str, str] | None = None, check: bool = True, timeout: float = 300):
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=full_env, cwd=tmp_path, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    return run
