r"""The one sanitiser for text from outside: what the user's script wrote or named (exception
messages, file names, guards, stderr, metric names, labels) made safe to show. Every renderer
(terminal views, the live view, HTML, SVG, JUnit XML, OpenTelemetry attributes) passes such text
through :func:`visible` (one string) or :func:`visible_tree` (a whole report) and nothing else
defines which characters are unsafe.

Unsafe characters become visible escapes (``\x1b``, ``\u202e``), so nothing a script printed can
move the cursor, clear the screen, retitle the terminal, reorder what a reader sees (bidirectional
overrides: "Trojan Source") or make an XML file ill-formed. Tabs stay. A newline is kept only where
the caller shows multi-line text (``newlines=True``: an HTML ``<pre>``, a JUnit failure body);
everywhere else, one-line summaries included, it shows as ``\n``, so a message of many lines stays
on the one line it was given. Backslashes are left as they are (Windows paths stay readable), so
the function is idempotent. Markup escaping (``<``, ``&``) stays the job of each format's own
escaper, applied after :func:`visible`.

>>> visible("boom\n\x1b]0;title\x07 \u202eevil")
'boom\\n\\x1b]0;title\\x07 \\u202eevil'
>>> visible(visible("a\nb", newlines=True)) == visible("a\nb")
True
"""

from __future__ import annotations

import dataclasses
import re
from enum import Enum
from collections.abc import Callable
from typing import Any, TypeVar, cast

_T = TypeVar("_T")

# C0 controls but tab and newline, DEL, C1 controls; the bidirectional marks, embeddings,
# overrides and isolates (U+061C, U+200E-200F, U+202A-202E, U+2066-2069); the line and paragraph
# separators; the code points XML 1.0 forbids (lone surrogates, U+FFFE, U+FFFF)
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\n]")
_SHORT = {"\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def visible(text: object, newlines: bool = False) -> str:
    r"""``str(text)`` with every unsafe character written as an escape; tabs stay, and newlines
    too when ``newlines``.

    >>> visible("loss\x1b[2J nan\tok\x00")
    'loss\\x1b[2J nan\tok\\x00'
    >>> visible("a\r\nb"), visible("a\nb", newlines=True)
    ('a\\r\\nb', 'a\nb')
    """
    return (_UNSAFE if newlines else _UNSAFE_LINE).sub(_escape, str(text))


def visible_tree(data: _T, newlines: bool = False) -> _T:
    r"""A copy of a JSON-like structure (or a dataclass of them, such as a typed report) with every
    string, keys included, passed through :func:`visible` (for renderers that show a whole report).

    >>> visible_tree({"title\x07": ["\u202eevil\n", 3]})
    {'title\\x07': ['\\u202eevil\\n', 3]}
    """
    return map_strings(data, lambda text: visible(text, newlines), keys=visible)


def map_strings(data: _T, change: Callable[[str], str], keys: Callable[[str], str] | None = None) -> _T:
    """A copy of a JSON-like structure (or a dataclass of them, such as a typed report) with
    ``change`` applied to every string in it, and ``keys`` (default: ``change``) to every key.

    >>> map_strings({"a": ["b", 1]}, str.upper)
    {'A': ['B', 1]}
    """
    return cast(_T, _map(data, change, keys or change))  # the same shape (a tuple comes back a list, as JSON has it)


def _map(data: Any, change: Callable[[str], str], keys: Callable[[str], str]) -> Any:
    if isinstance(data, Enum):  # before str: a Verdict is both
        return data
    if isinstance(data, str):  # the commonest first: a report of many ranks holds tens of thousands
        return change(data)
    if isinstance(data, dict):
        return {keys(k) if isinstance(k, str) else k: _map(v, change, keys) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_map(v, change, keys) for v in data]
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        fields = (f.name for f in dataclasses.fields(data) if f.init)
        return dataclasses.replace(data, **{name: _map(getattr(data, name), change, keys) for name in fields})
    return data
