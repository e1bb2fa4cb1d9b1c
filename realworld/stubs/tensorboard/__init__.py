"""A stand-in for tensorboard (not installed here): makemore/makemore.py opens a
torch.utils.tensorboard.SummaryWriter, which imports some twenty tensorboard modules; the corpus
needs none of the event files it writes. Every ``tensorboard.*`` module imports, and every name in
one is an object that accepts any call and attribute and does nothing."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "2.20.0"  # torch.utils.tensorboard refuses a tensorboard older than 1.15


class _Nothing:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Nothing:
        return self

    def __getattr__(self, name: str) -> _Nothing:
        return self


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Nothing()


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.meta_path.append(_Finder())
