"""Text from the user's script (exception messages, file names, guards, stderr) made safe to show:
control characters become visible escapes, so nothing the script printed can move the cursor,
clear the screen, retitle the terminal or break an XML file."""

from __future__ import annotations

import dataclasses
import re
from enum import Enum

# C0 controls but tab and newline, DEL, C1 controls, bidirectional overrides and isolates, and the
# code points XML 1.0 forbids (lone surrogates, U+FFFE, U+FFFF)
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_UNSAFE_LINE = re.compile(_UNSAFE.pattern[:-1] + "\n]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, newlines: bool = False) -> str:
    r"""``text`` with every control character written as an escape (``\x1b``); tabs stay, and
    newlines too when ``newlines``.

    >>> visible("loss\x1b[2J nan\tok")
    'loss\\x1b[2J nan\tok'
    >>> visible("a\nb"), visible("a\nb", newlines=True)
    ('a\\x0ab', 'a\nb')
    """
    return (_UNSAFE if newlines else _UNSAFE_LINE).sub(_escape, str(text))


def visible_tree(data: object) -> object:
    r"""A copy of a JSON-like structure (or a dataclass of them, such as a typed report) with every
    string passed through :func:`visible` (for renderers).

    >>> visible_tree({"title\x07": ["\u202eevil", 3]})
    {'title\\x07': ['\\u202eevil', 3]}
    """
    if isinstance(data, Enum):
        return data
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.replace(
            data, **{f.name: visible_tree(getattr(data, f.name)) for f in dataclasses.fields(data) if f.init}
        )
    if isinstance(data, str):
        return visible(data, newlines=True)
    if isinstance(data, dict):
        return {visible(k) if isinstance(k, str) else k: visible_tree(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [visible_tree(v) for v in data]
    return data
