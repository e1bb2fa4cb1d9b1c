"""docs/commands.md is the one command reference: its synopsis names every command and sub-command,
each has a table of its arguments written from the parser (tests/command_reference.py --write), and
every help text names only options its own command has, or another command's with that command
named (``torchrepro run --out``). That every argument has help: tests/unit/test_command_line.py."""

from __future__ import annotations

import re

import pytest

from command_reference import REFERENCE, commands, generated, tables

_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def test_every_command_has_its_table_and_every_table_is_the_parsers():
    text = REFERENCE.read_text(encoding="utf-8")
    missing = [name for name in commands() if name not in tables(text)]
    assert not missing, f"commands with no option table in docs/commands.md: {missing}"
    assert generated(text) == text, (
        "docs/commands.md's option tables differ from --help: python tests/command_reference.py --write"
    )


def test_the_synopsis_names_every_command_and_sub_command():
    text = REFERENCE.read_text(encoding="utf-8")
    block = text.split("\n## Synopsis\n", 1)[1].split("\n```\n", 2)[1]
    named = {m.group(1) for m in re.finditer(r"^torchrepro ((?:cache |golden )?[a-z-]+)", block, re.M)}
    assert set(commands()) <= named, f"commands the synopsis leaves out: {sorted(set(commands()) - named)}"
    sections = re.findall(r"^#{2,3} `torchrepro ([a-z -]+)`$", text, re.M)
    assert set(commands()) <= set(sections), f"commands with no section: {sorted(set(commands()) - set(sections))}"


def _foreign(help_text: str, own: set[str]) -> list[str]:
    """The options ``help_text`` names that are not in ``own`` and not qualified by the command
    they belong to (``check --against``, ``golden record --out``)."""
    names = sorted(commands(), key=len, reverse=True)
    found = []
    for match in _OPTION.finditer(help_text):
        before = help_text[: match.start()].rstrip()
        qualified = any(before.endswith(name) for name in names)
        if match.group() not in own and not qualified:
            found.append(match.group())
    return found


def test_a_foreign_option_is_found_and_one_qualified_by_its_command_is_not():
    assert _foreign("with --replay-step: repeat", {"--replay-step"}) == []
    assert _foreign("replace the --json/--junit/--html files", {"--json", "--junit"}) == ["--html"]
    assert _foreign("the run directory (torchrepro run --out, or a check's run)", set()) == []
    assert _foreign("what check --against compares with", set()) == []


@pytest.mark.parametrize("command", list(commands()))
def test_help_texts_name_only_what_the_command_has(command):
    parser = commands()[command]
    own = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        foreign = _foreign(action.help or "", own)
        assert not foreign, f"{command} {action.option_strings or action.dest}: its help names {foreign}"
