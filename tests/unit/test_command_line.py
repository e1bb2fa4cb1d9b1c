"""The command line as a new user types it: what comes after the script is the script's (a
command's own option there is said in one warning line), ``-m MODULE`` in place of a script,
torchrun's ``--nproc-per-node``, ``--junit`` wherever there is a verdict, help on every argument
(the same commands run for real: tests/e2e/test_command_line_runs.py)."""

from __future__ import annotations

import argparse

import pytest
from command_reference import commands as command_parsers
from command_reference import parsers

from torchrepro.cli import build_parser
from torchrepro.commands import options
from torchrepro.commands.outputs import check_args
from torchrepro.errors import UserError

VERDICTS = ("doctor", "check", "check-resume", "diff", "compare", "drift", "report")
LAUNCHERS = ("doctor", "check", "check-resume", "compare")  # the commands with --nproc


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {name for action in parser._actions for name in action.option_strings}


def parse(capsys, *argv: str) -> tuple[argparse.Namespace, str]:
    args = build_parser(argv[0]).parse_args(list(argv))
    return args, capsys.readouterr().err


def test_every_argument_has_help():
    bare = [
        f"torchrepro {command} {action.metavar or action.dest}".replace("  ", " ")
        for command, parser in parsers().items()
        for action in parser._actions
        if not action.help
    ]
    assert bare == []


@pytest.mark.parametrize("command", VERDICTS)
def test_every_verdict_can_be_written_for_ci_and_force_names_only_what_the_command_writes(command):
    parser = command_parsers()[command]
    outputs = {"--json", "--junit", "--html"} & _flags(parser)
    assert {"--json", "--junit", "--absolute-paths"} <= _flags(parser)
    [force] = [a for a in parser._actions if "--force" in a.option_strings]
    named = {word.strip("(),") for word in force.help.replace("/", " ").split() if word.startswith("--")}
    assert named == outputs, force.help


@pytest.mark.parametrize("command", LAUNCHERS)
def test_torchrun_spellings_of_nproc(capsys, command):
    for spelling in ("--nproc", "--nproc-per-node", "--nproc_per_node"):
        args, err = parse(capsys, command, *(["--at", "1"] if command == "check-resume" else []), spelling, "3", "t.py")
        assert args.nproc == 3 and err == ""
    with pytest.raises(SystemExit) as stopped:
        parse(capsys, command, "--nproc-per-node=0", "t.py")
    assert stopped.value.code == 2


def test_an_option_of_the_command_after_the_script_is_the_scripts_and_said(capsys):
    args, err = parse(capsys, "doctor", "train.py", "--max-recompiles", "0", "--json=x.json", "--epochs", "2")
    assert args.script == "train.py" and args.max_recompiles is None and args.json is None
    assert args.args == ["--max-recompiles", "0", "--json=x.json", "--epochs", "2"]  # the script gets them all
    [line] = err.splitlines()
    assert line.startswith("torchrepro: warning: --max-recompiles, --json after train.py are the script's")
    assert "put them before train.py" in line and "train.py -- ARGS" in line


def test_after_a_double_dash_they_are_the_scripts_and_nothing_is_said(capsys):
    args, err = parse(capsys, "doctor", "--max-recompiles", "0", "train.py", "--", "--json", "x", "--", "y")
    assert (args.max_recompiles, args.args, err) == (0, ["--json", "x", "--", "y"], "")
    args, err = parse(capsys, "check", "train.py", "--epochs", "1", "--", "--seed", "3")
    assert args.args == ["--epochs", "1", "--", "--seed", "3"] and err == ""  # options before the -- are looked at


def test_compare_looks_at_both_sides(capsys):
    args, err = parse(capsys, "compare", "a.py", "--seed", "1", "::", "b.py", "--out", "d", "--epochs", "2")
    assert args.args == ["--seed", "1", "::", "b.py", "--out", "d", "--epochs", "2"]
    assert err.startswith("torchrepro: warning: --seed, --out after a.py are the script's")
    _, err = parse(capsys, "compare", "a.py", "--", "--seed", "1", "::", "b.py", "--", "--out", "d")
    assert err == ""
    _, err = parse(capsys, "compare", "a.py", "::", "-m", "pkg.b", "--json", "j")
    assert "--json after a.py" in err


def test_a_module_in_place_of_a_script(tmp_path, monkeypatch, capsys):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('a package is not imported to find a module')\n")
    (tmp_path / "pkg" / "sub" / "train.py").write_text("print('trained')\n")
    (tmp_path / "pkg" / "__main__.py").write_text("print('main')\n")
    monkeypatch.chdir(tmp_path)
    args, err = parse(capsys, "doctor", "--seed", "1", "-m", "pkg.sub.train", "--epochs", "2", "--seed", "3")
    assert (args.module, args.script, args.seed) == ("pkg.sub.train", str(tmp_path / "pkg/sub/train.py"), 1)
    assert args.args == ["--epochs", "2", "--seed", "3"] and "--seed after -m pkg.sub.train" in err
    args, err = parse(capsys, "check", "-m", "pkg.sub.train", "--", "--json")
    assert args.args == ["--json"] and err == ""
    args, _ = parse(capsys, "run", "-mpkg")  # a package runs its __main__, as python -m pkg does
    assert (args.module, args.script, args.args) == ("pkg", str(tmp_path / "pkg/__main__.py"), [])
    args, _ = parse(capsys, "drift", "-m", "pkg", "x.py")
    assert args.module == "pkg" and args.args == ["x.py"]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["check", "-m"], "-m needs a MODULE"),
        (["check", "-m", "pkg.nothere"], "-m pkg.nothere: no such module in the working directory"),
        (["check", "-m", "a..b"], "not a module name"),
        (["check", "-m", "bare"], "a package with no __main__ module"),
        (["check"], "give the SCRIPT to run (or -m MODULE)"),
    ],
)
def test_a_module_that_cannot_run_is_a_usage_error(tmp_path, monkeypatch, capsys, argv, says):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "bare").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        build_parser(argv[0]).parse_args(argv)
    [line] = capsys.readouterr().err.splitlines()
    assert stopped.value.code == 2 and line.startswith("torchrepro: error: ") and says in line, line


def test_stdout_takes_one_document(capsys):
    args, _ = parse(capsys, "report", "run", "--json", "-", "--junit", "-")
    with pytest.raises(UserError, match=r"--json and --junit both name stdout \(-\)"):
        check_args(args)
    args, _ = parse(capsys, "report", "run", "--json", "-", "--junit", "j.xml")
    check_args(args)  # stdout is not a file: nothing to refuse


def test_env_and_watch_json_is_a_file_or_stdout_as_before(capsys):
    assert parse(capsys, "env", "--json")[0].json == options.STDOUT  # as before: on stdout
    assert parse(capsys, "env", "--json", "env.json")[0].json == "env.json"
    args, _ = parse(capsys, "watch", "run", "--once", "--json")
    assert (args.run_dir, args.json) == ("run", options.STDOUT)
    assert parse(capsys, "watch", "--once", "--json", "s.json", "run")[0].json == "s.json"
