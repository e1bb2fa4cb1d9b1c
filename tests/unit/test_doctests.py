"""The examples in the package's docstrings run and print what they say (``>>>`` lines marked
``# doctest: +SKIP`` need files or a compiled model and are only shown); the modules whose import
pulls in torch: tests/e2e/test_doctests_torch.py."""

from __future__ import annotations

import doctest
import importlib

import pytest
from docstring_examples import NEED_TORCH, failed_examples, modules_with_examples


@pytest.mark.parametrize("name", modules_with_examples(torch=False))
def test_docstring_examples(name):
    assert failed_examples(name) is None


def test_examples_are_found_and_run():
    assert "torchrepro.render.sanitize" in modules_with_examples(torch=False)
    assert NEED_TORCH <= set(modules_with_examples(torch=True))  # each still has examples
    assert doctest.testmod(importlib.import_module("torchrepro.render.sanitize")).attempted >= 3
