"""The examples README.md and docs/ show, read as a test reads them.

An example is a fenced block whose first line starts with ``$ ``: each ``$ `` line is a command,
the lines below it (up to the next ``$ `` line) what it prints, standard output then standard
error as a terminal shows them. Between what a page shows and what the command prints:

- ``[...]`` on a line of its own stands for any number of lines (none included); inside a line,
  for any text within that line. Every elision is marked so: nothing else is left out.
- Durations (``17.5 s``, ``713.9 ms/step``, ``2 min``), the time stamp in a run directory's
  default name (``20261207-090608``), and a run's share of its time spent compiling
  (``29% of the run``) differ from run to run and match whatever value the command printed.
- Trailing spaces are ignored.

The line before the block may say how the suite runs it, in an HTML comment a reader of the
rendered page does not see: ``<!-- example: make test -->`` (the suite's default tier: cheap
commands), none (the slow tier), or ``<!-- example: not run: WHY -->`` (a command this machine
cannot run: a GPU, a cluster, a measurement of minutes; the reason is required).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ELIDED = "[...]"
_MARK = re.compile(r"<!--\s*example:\s*(.*?)\s*-->")
_VOLATILE = [
    (re.compile(r"\b\d+(?:\.\d+)?(?:e[-+]?\d+)? ?(?:µs|us|ms|s|min|h)\b(?=/| |,|\)|\.|;|$)"), "<time>"),
    (re.compile(r"\b20\d{6}-\d{6}(?:-\d+)?\b"), "<stamp>"),
    (re.compile(r"\b\d+(?:\.\d+)? ?% of the run\b"), "<share> of the run"),
]


@dataclass(frozen=True)
class Command:
    """One ``$ `` line of an example and the lines shown below it."""

    text: str
    shown: tuple[str, ...]


@dataclass(frozen=True)
class Example:
    """A fenced block of a page that shows commands and what they print."""

    page: Path
    line: int  # of the block's first command, 1-based
    commands: tuple[Command, ...]
    tier: str  # "make test", "slow" or "not run"
    reason: str = ""  # why it is not run

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every page that teaches or proves: README.md and docs/ (evidence pages included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples(page: Path) -> list[Example]:
    """The examples ``page`` shows, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if not body or not body[0].startswith("$ "):
            continue
        mark = _MARK.search(lines[start - 1]) if start else None
        tier, reason = "slow", ""
        if mark:
            said = mark.group(1)
            if said.startswith("not run"):
                tier, reason = "not run", said.partition(":")[2].strip()
            elif said == "make test":
                tier = "make test"
            else:
                raise ValueError(f"{page.name}:{start}: unknown example mark {said!r}")
        commands: list[Command] = []
        for text in body:
            if text.startswith("$ "):
                commands.append(Command(text[2:], ()))
            else:
                last = commands[-1]
                commands[-1] = Command(last.text, (*last.shown, text))
        found.append(Example(page, start + 2, tuple(_trimmed(c) for c in commands), tier, reason))
    return found


def _trimmed(command: Command) -> Command:
    shown = list(command.shown)
    while shown and not shown[-1].strip():
        shown.pop()
    return Command(command.text, tuple(shown))


def normalise(line: str) -> str:
    """``line`` with what differs from run to run replaced (durations, time stamps) and no trailing spaces."""
    line = line.rstrip()
    for pattern, placeholder in _VOLATILE:
        line = pattern.sub(placeholder, line)
    return line


def _pattern(shown: str) -> re.Pattern[str]:
    parts = normalise(shown).split(ELIDED)
    return re.compile(".*?".join(re.escape(p) for p in parts) + r"\Z", re.S)


def mismatch(shown: tuple[str, ...] | list[str], printed: list[str]) -> str | None:
    """None when ``printed`` is what ``shown`` shows (its elisions included), else where they part."""
    want = [s for s in shown]
    have = [normalise(p) for p in printed]
    while have and not have[-1]:
        have.pop()
    patterns = [None if s.strip() == ELIDED else _pattern(s) for s in want]
    best = [0, 0]  # the furthest (shown line, printed line) reached, for the message

    def match(i: int, j: int, memo: dict[tuple[int, int], bool]) -> bool:
        if (i, j) in memo:
            return memo[(i, j)]
        if i > best[0]:
            best[:] = [i, j]
        if i == len(patterns):
            ok = j == len(have)
        elif patterns[i] is None:
            ok = any(match(i + 1, k, memo) for k in range(j, len(have) + 1))
        else:
            ok = j < len(have) and bool(patterns[i].match(have[j])) and match(i + 1, j + 1, memo)
        memo[(i, j)] = ok
        return ok

    if match(0, 0, {}):
        return None
    i, j = best
    expected = want[i] if i < len(want) else "(the end of the output)"
    got = printed[j] if j < len(printed) else "(the end of the output)"
    return f"shown line {i + 1}: {expected!r}\n  printed line {j + 1}: {got!r}"
