"""The one rule for showing a path, in the terminal and in everything a report stores (report.json,
report.html, JUnit, ``--json``): a path under the working directory is shown relative to it, one
under the home directory as ``~/...``, anything else as it is. Reports are meant to be attached
to bug reports: they carry no home directory unless asked (``--absolute-paths``).

>>> import os
>>> display_path(os.path.join(os.getcwd(), "runs", "a"))
'runs/a'
>>> display_path("/srv/data/train.py", base="/srv")
'data/train.py'
>>> display_path("/opt/x.py", base="/srv")
'/opt/x.py'
>>> display_paths("graph break at /srv/proj/train.py:72, cache in /srv/proj", base="/srv/proj")
'graph break at train.py:72, cache in .'
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TypeVar

from .. import _state
from .sanitize import map_strings

_T = TypeVar("_T")
_ABSOLUTE = _state.kept(bool)  # --absolute-paths: reports keep every path as it is


def display_path(path: str | os.PathLike[str], base: str | os.PathLike[str] | None = None) -> str:
    """``path`` as shown to people: relative to ``base`` (default: the working directory) when it
    lies under it (``.`` for ``base`` itself), else ``~/...`` when it lies under the home
    directory, else absolute. A relative ``path`` is taken as relative to the working directory.
    Nothing is resolved on disk (no symlink is followed; the path need not exist).

    >>> display_path(os.path.expanduser("~/other/run"), base="/nowhere")
    '~/other/run'
    >>> display_path("/srv", base="/srv")
    '.'
    """
    absolute = os.path.abspath(os.fspath(path))
    if (root := _base(base)) and (inside := _under(absolute, root)) is not None:
        return inside
    home = os.path.expanduser("~")
    if home not in ("~", "/") and (inside := _under(absolute, os.path.abspath(home))) is not None:
        return "~" if inside == "." else os.path.join("~", inside)
    return absolute


def _base(base: str | os.PathLike[str] | None) -> str | None:
    """``base`` made absolute, or the working directory; None when that was removed (nothing lies under it)."""
    try:
        return os.path.abspath(os.fspath(base)) if base is not None else os.getcwd()
    except FileNotFoundError:
        return None


def _under(path: str, directory: str) -> str | None:
    """``path`` relative to ``directory`` when it is ``directory`` or lies under it, else None."""
    if directory == os.sep:
        return None  # everything lies under /: a path relative to it says less than the absolute one
    if path == directory:
        return "."
    if path.startswith(directory.rstrip(os.sep) + os.sep):
        return path[len(directory.rstrip(os.sep)) + 1 :]
    return None


# a path starts where no path character precedes it, and a directory's path ends at a "/" or
# where no path character follows
_BEFORE, _AFTER = r"(?<![\w.~/-])", r"(?:/|(?![\w.-]))"


def display_paths(text: str, base: str | os.PathLike[str] | None = None) -> str:
    """``text`` with every absolute path in it under ``base`` (default: the working directory) or
    the home directory written as :func:`display_path` writes it: for the paths inside messages,
    evidence and provenance a report stores (``graph break at /home/me/proj/train.py:72`` →
    ``graph break at train.py:72``). A path elsewhere is left as it is.

    >>> display_paths("see /srv/a/b.py and /srv/ab/c.py", base="/srv/a")
    'see b.py and /srv/ab/c.py'
    """
    return path_rewriter(base)(text)


def path_rewriter(base: str | os.PathLike[str] | None) -> Callable[[str], str]:
    """:func:`display_paths` for one ``base`` (None: the working directory), its patterns made once:
    for the many strings of a report."""
    home = os.path.abspath(os.path.expanduser("~"))
    rules = [
        (directory, re.compile(_BEFORE + re.escape(directory.rstrip(os.sep)) + _AFTER), shown)
        for directory, shown in ((_base(base), ""), (home, "~/"))
        if directory and directory not in (os.sep, "~")
    ]

    def rewrite(text: str) -> str:
        for directory, pattern, shown in rules:
            if directory in text:
                text = pattern.sub(lambda m: shown if m.group().endswith("/") else (shown.rstrip("/") or "."), text)
        return text

    return rewrite


def keep_absolute_paths() -> None:
    """``--absolute-paths``: the reports this process writes keep every path as it is."""
    _ABSOLUTE.value = True


def stored(report: _T) -> _T:
    """``report`` (a typed report, or any JSON-like data) as it is written to a file someone may
    attach to a bug report (``report.json``, ``report.html``, ``--json``/``--junit``/``--html``):
    every path in every string of it as :func:`display_paths` writes it, relative to the working
    directory; as it is after :func:`keep_absolute_paths`.

    >>> stored({"run_dirs": {"a": os.path.join(os.getcwd(), "runs", "a")}})
    {'run_dirs': {'a': 'runs/a'}}
    """
    return report if _ABSOLUTE.value else map_strings(report, path_rewriter(None))
