"""The package's modules with docstring examples, in two lists: those whose import pulls in torch
(their examples run in tests/e2e/test_doctests_torch.py) and the rest (tests/unit/test_doctests.py,
where importing torch fails: a module that starts to need torch belongs in NEED_TORCH)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "torchrepro"
# importing the bootstrap installs capture in this interpreter: it has no examples to run
NOT_IMPORTED = {"torchrepro.runtime._bootstrap.sitecustomize"}
NEED_TORCH = {
    "torchrepro.capture.graph_probe",
    "torchrepro.checkpoint",
    "torchrepro.rng",
    "torchrepro.runtime.metrics",
    "torchrepro.seed",
}


def modules_with_examples(*, torch: bool) -> list[str]:
    """The modules with ``>>>`` examples that need torch (``torch``) or not."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>>" not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name not in NOT_IMPORTED and (name in NEED_TORCH) == torch:
            names.append(name)
    return names


def failed_examples(name: str) -> str | None:
    """What failed of the examples in module ``name`` (None when they all print what they say)."""
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS, verbose=False)
    return f"{result.failed} of {result.attempted} example(s) in {name} failed" if result.failed else None
