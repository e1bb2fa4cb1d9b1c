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

from .. import _state


_KEPT: _state.Kept[dict[str, list[Callable[[], None]]]] = _state.kept(dict)  # module -> callbacks, while awaited


def _waiting() -> dict[str, list[Callable[[], None]]]:
    """Module name -> callbacks, while its import is awaited (this process's: :func:`torchrepro._state.kept`)."""
    return _KEPT.value


class _Hook(importlib.abc.MetaPathFinder):
    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        _remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            _waiting().pop(fullname, None)
            return spec
        exec_module = loader.exec_module

        def exec_then_call(module: Any) -> None:
            exec_module(module)
            for callback in _waiting().pop(fullname, []):  # also those added while the module ran
                callback()

        setattr(loader, "exec_module", exec_then_call)  # this spec's loader only: one module, loaded once
        return spec


def _remove(hook: _Hook) -> None:
    if hook in sys.meta_path:
        sys.meta_path.remove(hook)


def when_imported(name: str, callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` once ``name`` is imported (now, if it is); returns a function that
    cancels a callback still waiting. A module still running its own code (it imported
    something that asked) counts as not imported yet: the callback runs when it is done."""
    if name in sys.modules and name not in _waiting():
        callback()
        return lambda: None
    if name not in _waiting():
        _waiting()[name] = []
        sys.meta_path.insert(0, _Hook(name))
    _waiting()[name].append(callback)

    def cancel() -> None:
        waiting = _waiting().get(name, [])
        if callback in waiting:
            waiting.remove(callback)
        if name in _waiting() and not waiting:  # nothing left to call: the import hook goes too
            del _waiting()[name]
            for hook in [h for h in sys.meta_path if isinstance(h, _Hook) and h.name == name]:
                _remove(hook)

    return cancel
