"""The rule of the unit tier (tests/unit/): pure logic on hand-built events, reports, options and
bytes, with no torch and no process. While a test module here is collected and while a test here
runs (its fixtures included), importing torch raises ImportError and starting a process (subprocess,
os.fork, os.posix_spawn, multiprocessing) raises RuntimeError, each saying where such a test goes:
tests/e2e/.

Run alone (`make test-fast`; `make test` runs this tier first, in its own pytest), the rule is
complete. Run in one pytest with tests/e2e/, a torch an end-to-end module imported before is
already in ``sys.modules`` and an import of it is not seen here; the rule still holds for
processes."""

from __future__ import annotations

import importlib.abc
import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WHERE = "tests/unit/ is for tests without torch and without processes: this test belongs in tests/e2e/"


class _NoTorch(importlib.abc.MetaPathFinder):
    """Refuses ``torch`` and its submodules while ``active``."""

    active = False

    def find_spec(self, name, path=None, target=None):
        if self.active and (name == "torch" or name.startswith("torch.")):
            raise ImportError(f"import of {name} refused: {WHERE}")
        return None


_FINDER = _NoTorch()
sys.meta_path.insert(0, _FINDER)


def _refused(*args, **kwargs):
    raise RuntimeError(f"a process was started: {WHERE}")


_STARTS = (
    (subprocess.Popen, "__init__"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (multiprocessing.process.BaseProcess, "start"),
)


@contextmanager
def _the_rule() -> Iterator[None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name in _STARTS]
    for owner, name, _ in saved:
        setattr(owner, name, _refused)
    _FINDER.active = True
    try:
        yield
    finally:
        _FINDER.active = False
        for owner, name, start in saved:
            setattr(owner, name, start)


def _here(path: Path) -> bool:
    return HERE in Path(path).resolve().parents


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Importing a test module of this tier (collection) under the rule."""
    if isinstance(collector, pytest.Module) and _here(collector.path):
        with _the_rule():
            yield
    else:
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test of this tier under the rule: setup (fixtures of any scope), call and teardown."""
    if _here(item.path):
        with _the_rule():
            yield
    else:
        yield
