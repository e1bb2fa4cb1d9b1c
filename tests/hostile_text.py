"""Hostile text a user's run can put in a report, and the checks that an output shows it only
escaped: HOSTILE (terminal escapes, controls, bidirectional overrides, a newline) through the
sanitiser (report/sanitize.py), MARKUP through the HTML report."""

from __future__ import annotations

import io
import re
from xml.etree import ElementTree as ET

from rich.console import Console

# what a hostile script may print or name: clear the screen, retitle the terminal (OSC ... BEL),
# C0 and C1 controls, NUL, DEL, a right-to-left override and a left-to-right isolate, a newline
HOSTILE = "boom\x1b[2J\x1b]0;title\x07 nul\x00 del\x7f csi\x9b bs\x08 \u202eevil\u2066iso\u2069 \u200fmark two\nlines"


# the visible escapes every renderer shows instead (NUL's only where the text could hold one)
ESCAPES = ("\\x1b[2J", "\\x1b]0;title\\x07", "\\x7f", "\\x9b", "\\u202eevil", "\\u2066iso\\u2069", "\\u200fmark")


# no raw control (but tab and newline) or bidirectional character may reach an output
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def assert_shown(out: str, *, one_line: bool = True, nul: bool = True) -> None:
    """No raw character of HOSTILE in ``out``, its visible escapes instead; on one line (the newline
    as ``\\n``) where ``one_line``."""
    assert not RAW.search(out), f"a raw control character reached the output: {RAW.search(out).group()!r}"
    for escape in ESCAPES + (("\\x00",) if nul else ()):
        assert escape in out, f"{escape} is not in the output"
    if one_line:
        assert "two\\nlines" in out and "two\nlines" not in out


def text_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400, color_system=None, highlight=False), buf


MARKUP = "<img src=x onerror=alert(1)> & \"quoted\" 'single' \x1b[31mred\x1b[0m"


def assert_safe(page: str) -> None:
    assert not CONTROL.search(page), "a control character reached the page raw"
    assert "<img" not in page and "<script" not in page and "onerror=alert(1)>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; &#34;quoted&#34; &#39;single&#39; \\x1b[31mred\\x1b[0m" in page


CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def assert_svg_shown(svg: str) -> None:
    """``svg`` is well-formed (no character XML forbids) and its texts show HOSTILE only escaped."""
    root = ET.fromstring(svg)
    texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert_shown(texts)
    assert "<b>" not in svg
