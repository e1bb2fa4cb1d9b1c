"""Run a callback once a module has been imported, without importing it.

Capture tells Dynamo to skip or not trace its wrappers; importing ``torch._dynamo`` for that at
start costs a script that never compiles about a second. Instead the callback runs as soon as
the script (or torch) imports Dynamo, before anything can be compiled: right away if it is
imported already, else from an import hook, just after the module's own code has run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any


class _Hook(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callable[[], None]):
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        _remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if spec is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, callback = loader.exec_module, self.callback

        def exec_then_call(module: Any) -> None:
            exec_module(module)
            callback()

        loader.exec_module = exec_then_call  # this spec's loader only: one module, loaded once
        return spec


def _remove(hook: _Hook) -> None:
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)


def when_imported(name: str, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` once ``name`` is imported (now, if it is); returns a function that
    cancels a callback still waiting."""
    if name in sys.modules:
        callback()
        return lambda: None
    hook = _Hook(name, callback)
    sys.meta_path.insert(0, hook)
    return lambda: _remove(hook)
