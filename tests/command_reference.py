"""The option tables of docs/commands.md, generated from the parser ``torchrepro --help`` shows.

Each command's section holds its table between two marks::

    <!-- options: check -->
    ...
    <!-- end options -->

``python tests/command_reference.py --write`` writes every table again from the help texts;
tests/unit/test_command_reference.py fails while a table differs from what it writes (edit a
help text in the code, then run this), or while a command has no section or no table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "commands.md"
_TABLE = re.compile(r"(<!-- options: (?P<name>[a-z -]+?) -->\n)(?P<body>.*?)(<!-- end options -->)", re.S)


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command and sub-command (``cache pack``) the parser has, in ``--help``'s order."""
    sys.path.insert(0, str(ROOT / "src"))
    from torchrepro.cli import build_parser

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    full = f"{prefix} {name}".strip()
                    if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                        found[full] = sub
                    walk(full, sub)

    walk("", build_parser())
    return found


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def table(parser: argparse.ArgumentParser) -> str:
    """The markdown table of ``parser``'s arguments: positional first, then options, as --help orders them."""
    rows = ["| argument | meaning |", "| --- | --- |"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or "--help" in action.option_strings:
            continue
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = "" if action.nargs == 0 else f" {action.metavar or action.dest.upper()}"
            names = ", ".join(f"`{s}{metavar}`" for s in action.option_strings)
        else:
            names = f"`{action.metavar or action.dest}`"
        rows.append(f"| {names} | {_cell(action.help or '')} |")
    return "\n".join(rows) + "\n"


def generated(text: str) -> str:
    """``text`` (commands.md) with every table written again from the parser."""
    parsers = commands()

    def again(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in parsers:
            raise SystemExit(f"docs/commands.md: a table for {name!r}, which is no command")
        return match.group(1) + table(parsers[name]) + match.group(4)

    return _TABLE.sub(again, text)


def tables(text: str) -> list[str]:
    """The commands ``text`` has a table for."""
    return [m.group("name") for m in _TABLE.finditer(text)]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/command_reference.py --write")
    before = REFERENCE.read_text(encoding="utf-8")
    after = generated(before)
    REFERENCE.write_text(after, encoding="utf-8")
    print("docs/commands.md: " + ("tables written again" if after != before else "unchanged"))
