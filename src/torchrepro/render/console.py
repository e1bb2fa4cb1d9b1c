"""How every command lays text out, the same in each: the console it prints through, text made
safe and its paths shown by the one rule, cells that wrap instead of being cut, and an absent
value shown as a dash.

On a terminal, the terminal's width (``COLUMNS`` overrides it): text and table cells wrap at it.
Anywhere else (a pipe, a file, a CI log) nothing is laid out for 80 columns: a line is never
wrapped (a log viewer wraps it where the reader's window ends, and ``grep`` finds it whole) and a
table is as wide as its cells need.

A name, guard, reason or path is never cut: its cell wraps (``fold``). What is cut for room (an
error's tail, a list of ids) ends in ``…``.

>>> figure(None), figure(0.000123456), figure(float("nan")), figure(3)
('—', '0.000123', 'nan', '3')
>>> clip("a" * 10, 6)
'aaaaa…'
"""

from __future__ import annotations

import os
from typing import IO, TYPE_CHECKING, TypeVar

from .paths import display_path, path_rewriter
from .sanitize import map_strings, visible

if TYPE_CHECKING:  # rich is imported where something is printed
    from rich.console import Console
    from rich.table import Table

_T = TypeVar("_T")

ABSENT = "—"  # a value the report does not have
OFF_TERMINAL_WIDTH = 1000  # what a table may take off a terminal before its cells wrap: in practice, never


def console(stderr: bool = False, file: IO[str] | None = None) -> Console:
    """The console a command prints through: rich's own on a terminal (and in a notebook);
    elsewhere one that never wraps a line and lays tables out as wide as their cells (module
    docstring).

    Example: ``render_doctor(report, console(file=buf))``.
    """
    from rich.console import Console

    on_terminal = Console(stderr=stderr, file=file)
    if on_terminal.is_terminal or on_terminal.is_jupyter:  # a notebook lays out its own output
        return on_terminal
    return Console(stderr=stderr, file=file, width=OFF_TERMINAL_WIDTH, soft_wrap=True)


def shown(data: _T) -> _T:
    """A copy of ``data`` (a report, a section of one, a string) as the terminal shows it: every
    string made visible (:func:`~torchrepro.render.sanitize.visible`) and every path in it written
    by the one rule (:func:`~torchrepro.render.paths.display_paths`: relative under the working
    directory)."""
    paths = path_rewriter(None)

    def one(text: str) -> str:
        text = visible(text)
        return paths(text) if os.sep in text else text  # most texts hold no path

    return map_strings(data, one)


def figure(value: float | int | None, digits: int = 3) -> str:
    """A number in a table cell: ``digits`` significant digits; NaN and infinities as Python
    writes them (``nan``, ``inf``: they are what the run produced); an absent value as a dash."""
    if value is None:
        return ABSENT
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}"


def cell(value: object) -> str:
    """Any value as a table cell's text: an absent value as a dash, never ``None``."""
    return ABSENT if value is None else str(value)


def location(file: str | None, line: int | None) -> str:
    """``file:line``, the file by the one path rule (:func:`~torchrepro.render.paths.display_path`);
    the file alone without a line, a dash without a file."""
    if not file:
        return ABSENT
    return display_path(file) + ("" if line is None else f":{line}")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with ``…``: for what is cut for room
    only (never a name, guard, reason or path)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text_columns(table: Table, *names: str) -> None:
    """Columns of text (names, guards, reasons, paths) that wrap, never cut."""
    for name in names:
        table.add_column(name, overflow="fold")


def figure_columns(table: Table, *names: str) -> None:
    """Columns of figures, right-aligned, on one line."""
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
