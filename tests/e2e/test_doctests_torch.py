"""The docstring examples of the modules whose import pulls in torch (docstring_examples.NEED_TORCH;
the others: tests/unit/test_doctests.py) run and print what they say."""

from __future__ import annotations

import pytest
from docstring_examples import failed_examples, modules_with_examples


@pytest.mark.parametrize("name", modules_with_examples(torch=True))
def test_docstring_examples_needing_torch(name):
    assert failed_examples(name) is None
