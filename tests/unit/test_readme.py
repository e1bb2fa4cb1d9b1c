"""The README as users read it: its exit-code table lists every code the commands can return (read
from the code that decides them), its test command is the one CI runs, and its links lead to pages
that exist."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from torchrepro.cli import COMMANDS
from torchrepro.errors import InputError, Stopped, UserError, stop_exit_code
from torchrepro.reports.findings import Verdict, comparison_exit_code

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # what torchrepro forwards to the job (docs/commands.md)


def _exit_table() -> dict[str, tuple[str, str]]:
    """``{code: (meaning, commands)}`` from the README's "Exit codes" table."""
    section = README.split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| exit")]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if set(cells[0]) <= {"-"}:
            continue
        table[cells[0].strip("*")] = (cells[1], cells[2])
    return table


def _listed(commands: str, command: str) -> bool:
    return commands.startswith("all") or f"`{command}`" in commands or f"`{command} " in commands


def test_exit_table_lists_every_code_the_commands_return():
    table = _exit_table()
    codes = {0, 1, 3}  # a report's: passing, failing, a run that did not end normally
    for verdict in Verdict:
        for ended in (True, False):
            for unreadable_exit in (2, 3):
                codes.add(comparison_exit_code(verdict, ended, True, unreadable_exit))
                codes.add(comparison_exit_code(verdict, ended, False, unreadable_exit))
    codes |= {UserError.exit_code, InputError("x").exit_code}
    documented = {int(c) for c in table if c.isdigit()}
    assert codes <= documented, f"codes the commands return but the README does not list: {codes - documented}"
    assert documented == {0, 1, 2, 3}, documented
    # a stop signal: 128 + N, with each forwarded signal's code spelled out
    meaning, _ = table["128+N"]
    for name in STOP_SIGNALS:
        code = Stopped("stopped", name).exit_code
        assert code == stop_exit_code(name) == 128 + signal.Signals[name].value
        assert f"{code} {name}" in meaning, (name, meaning)
    assert "script's" in table  # `run` exits as the script does


def test_exit_table_names_each_command_where_it_can_return_the_code():
    table = _exit_table()
    expected = {
        "0": COMMANDS,
        "1": ("doctor", "report", "check", "check-resume", "diff", "drift", "cache status", "cache verify"),
        "2": COMMANDS,
        "3": ("doctor", "report", "check", "check-resume", "diff", "drift"),
        "128+N": ("doctor", "check", "check-resume"),
        "script's": ("run",),
    }
    for code, commands in expected.items():
        listed = table[code][1]
        missing = [c for c in commands if not _listed(listed, c)]
        assert not missing, f"exit {code}: {missing} not listed in {listed!r}"
    assert "INCOMPLETE" in table["3"][0] and "`diff`" in table["3"][0]  # diff's exit 3 is a verdict too


def test_readme_commands_are_the_ones_ci_runs():
    block = re.search(r"\n```\n(make demo .*?)```", README, re.S).group(1)
    assert [line.split("#")[0].strip() for line in block.splitlines()] == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M) and re.search(r"^make test-slow$", ci, re.M)
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test", "test-slow", "gpu", "compat", "realworld"):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
        assert f"make {target}" in README, target


def test_readme_links_lead_to_pages_that_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert len(links) >= 10
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not missing, missing
    table = README.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    evidence = table.split("\n### Evidence", 1)[1]
    pages = [p.relative_to(ROOT).as_posix() for p in _pages()]
    unlinked = [p for p in pages if f"]({p})" not in table]
    assert not unlinked, f"docs pages the README's documentation table does not name: {unlinked}"
    misplaced = [p for p in pages if (f"]({p})" in evidence) != p.startswith("docs/evidence/")]
    assert not misplaced, f"pages listed under the wrong heading (Using torchrepro / Evidence): {misplaced}"


def _pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def test_docs_links_lead_to_pages_that_exist():
    for page in _pages():
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not link.startswith("http"):
                assert (page.parent / link).exists(), f"{page.relative_to(ROOT)}: {link}"


def test_changelog_releases_are_dated_newest_first_and_the_latest_is_the_package_version():
    import torchrepro

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)
    assert headings[0] == ("Unreleased", ""), headings[:1]
    releases = headings[1:]
    assert releases and all(date for _, date in releases), releases
    versions = [tuple(int(n) for n in v.split(".")) for v, _ in releases]
    assert versions == sorted(versions, reverse=True) and [d for _, d in releases] == sorted(
        (d for _, d in releases), reverse=True
    )
    project = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert releases[0][0] == project == torchrepro.__version__
    sections = set(re.findall(r"^### (\w+)$", text, re.M))
    assert sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, sections
    # it speaks to users of what changed, not of how the work was organised
    assert not re.findall(r"\b(?:sessions?|issues?|branch(?:es)?) #?\d+", text, re.I)
