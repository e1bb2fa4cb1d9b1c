"""Every example README.md and docs/ show is run and compared with what it shows (tests/docs_examples.py:
how a page marks what it leaves out, and which tier runs it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs_examples import ROOT, Example, examples, mismatch, pages

_RUN = [e for page in pages() for e in examples(page) if e.tier != "not run"]
_SEPARATOR = "@@torchrepro-docs-example@@"


def _param(example: Example):
    marks = [] if example.tier == "make test" else [pytest.mark.slow]
    return pytest.param(example, id=example.where, marks=marks)


def _sandbox(tmp_path: Path) -> Path:
    """A working directory with the files the examples name, as in a checkout."""
    for folder in ("examples", "tests/scripts"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


@pytest.mark.parametrize("example", [_param(e) for e in _RUN])
def test_the_example_prints_what_the_page_shows(example: Example, tmp_path):
    script = ["set +e"]
    for command in example.commands:
        script += [f"echo {_SEPARATOR}", f"{{ {command.text}\n}} 2>&1"]
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=_sandbox(tmp_path), env=env, text=True, capture_output=True, timeout=900
    )
    outputs = done.stdout.split(_SEPARATOR + "\n")[1:]
    assert len(outputs) == len(example.commands), done.stdout + done.stderr
    for command, printed in zip(example.commands, outputs):
        problem = mismatch(command.shown, printed.splitlines())
        assert problem is None, f"{example.where}: $ {command.text}\n{problem}\n--- printed:\n{printed}"
