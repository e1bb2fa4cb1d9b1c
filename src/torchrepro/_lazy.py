"""Lazy public APIs: a package names its API here and imports each piece on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_api(
    package: str, api: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` whose names in ``api`` live in submodules.

    >>> __getattr__, __dir__ = lazy_api(__name__, {"seed_everything": "seed"}, globals())  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        module = api.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        found = importlib.import_module(f".{module}", package)
        return found if module == name else getattr(found, name)

    def __dir__() -> list[str]:
        return sorted([*namespace, *api])

    return __getattr__, __dir__
