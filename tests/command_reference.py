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
import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "commands.md"
_TABLE = re.compile(r"(<!-- options: (?P<name>[a-z -]+?) -->\n)(?P<body>.*?)(<!-- end options -->)", re.S)


@functools.cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of the command line by its command (``""`` for ``torchrepro`` itself, ``cache``
    for the group, ``cache pack`` for a sub-command), in ``--help``'s order (built once)."""
    sys.path.insert(0, str(ROOT / "src"))
    from torchrepro.cli import build_parser

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        found[prefix] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{prefix} {name}".strip(), sub)

    walk("", build_parser())
    return found


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command and sub-command (``cache pack``) the parser has, in ``--help``'s order: the
    parsers that take no sub-command."""
    return {
        name: parser
        for name, parser in parsers().items()
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    }


def _cell(text: str, code: bool = False) -> str:
    """``text`` as one markdown table cell: ``|`` escaped, and outside code ``<`` and ``*`` too (a
    ``<time>`` would read as an HTML tag, two ``*`` as emphasis)."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if code else text.replace("<", "&lt;").replace("*", "\\*")


def table(parser: argparse.ArgumentParser) -> str:
    """The markdown table of ``parser``'s arguments, in the order the parser holds them, each
    spelled and explained as ``--help`` shows it (``{a,b}`` for a choice, ``[FILE]`` for an
    optional value, ``%%`` as ``%``)."""
    formatter = parser._get_formatter()
    rows = ["| argument | meaning |", "| --- | --- |"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or "--help" in action.option_strings:
            continue
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            value = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
            names = ", ".join(f"`{s} {value}`".replace(" `", "`") for s in action.option_strings)
        else:
            names = f"`{formatter._format_action_invocation(action)}`"
        rows.append(f"| {_cell(names, code=True)} | {_cell(formatter._expand_help(action) if action.help else '')} |")
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
