"""The examples in the package's docstrings run and print what they say (``>>>`` lines marked
``# doctest: +SKIP`` need files or a compiled model and are only shown)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "torchrepro"
# importing the bootstrap installs capture in this interpreter: it has no examples to run
NOT_IMPORTED = {"torchrepro.runtime._bootstrap.sitecustomize"}


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in NOT_IMPORTED:
            names.append(name)
    return names


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} example(s) in {name} failed"


def test_examples_are_found_and_run():
    assert "torchrepro.render.sanitize" in _modules_with_examples()
    assert doctest.testmod(importlib.import_module("torchrepro.render.sanitize")).attempted >= 3
