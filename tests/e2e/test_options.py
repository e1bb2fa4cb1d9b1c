"""The option layer (torchrepro.commands.options): every numeric flag of every command is checked by
one of its ``type=`` functions, and a bad value is a usage error (exit 2, one line, nothing created)
before anything runs, whatever the command."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from command_reference import commands as command_parsers
from torchrepro.commands import options

# Bad values per checker: out of range, not finite, not a number.
BAD = {
    options.positive_int: ["0", "-1", "1.5", "nan"],
    options.processes: ["0", "1.5", "100000"],  # more than the machine's bound (4 per usable core)
    options.count: ["-1", "inf", "x"],
    options.positive_float: ["0", "-1", "nan", "inf"],
    options.tolerance: ["-1e-9", "nan", "inf"],
    options.fraction: ["-0.1", "1.5", "nan"],
    options.finite: ["nan", "inf", "-inf"],
    options.seed: ["-1", "nan", str(2**128)],
    options.runs: ["1", "0", "-1"],
    options.size: ["0", "-5M", "lots"],
}
# Every numeric flag of every command, and its checker: a new numeric flag must be added here (and
# so get a checker and bad values) or test_every_numeric_flag_is_checked fails.
NUMERIC = {
    ("doctor", "--max-graph-breaks"): options.count,
    ("doctor", "--max-recompiles"): options.count,
    ("doctor", "--probe-repeats"): options.count,
    ("doctor", "--min-cache-hit-rate"): options.fraction,
    ("doctor", "--seed"): options.seed,
    ("doctor", "--fingerprint-every"): options.positive_int,
    ("doctor", "--nproc"): options.processes,
    ("doctor", "--timeout"): options.positive_float,
    ("check", "--runs"): options.runs,
    ("check", "--probe-repeats"): options.count,
    ("check", "--seed"): options.seed,
    ("check", "--nproc"): options.processes,
    ("check", "--timeout"): options.positive_float,
    ("check", "--rtol"): options.tolerance,
    ("check", "--atol"): options.tolerance,
    ("check", "--disk-budget"): options.size,
    ("compare", "--nproc"): options.processes,
    ("compare", "--nproc-b"): options.processes,
    ("compare", "--resume-b-at"): options.positive_int,
    ("compare", "--seed"): options.seed,
    ("compare", "--timeout"): options.positive_float,
    ("check-resume", "--at"): options.positive_int,
    ("check-resume", "--seed"): options.seed,
    ("check-resume", "--nproc"): options.processes,
    ("check-resume", "--timeout"): options.positive_float,
    ("diff", "--rtol"): options.tolerance,
    ("diff", "--atol"): options.tolerance,
    ("report", "--jobs"): options.processes,
    ("doctor", "--jobs"): options.processes,
    ("run", "--seed"): options.seed,
    ("run", "--fingerprint-every"): options.positive_int,
    ("run", "--probe-repeats"): options.count,
    ("run", "--replay-step"): options.count,
    ("run", "--stop-after-step"): options.count,
    ("watch", "--interval"): options.positive_float,
    ("drift", "--runs"): options.runs,
    ("drift", "--jobs"): options.positive_int,
    ("drift", "--seed"): options.seed,
    ("drift", "--observed"): options.finite,
    ("drift", "--target-effect"): options.positive_float,
    ("drift", "--run-one"): options.count,
    ("drift", "--max-runs"): options.positive_int,
    ("golden record", "--snapshot-budget"): options.size,
    ("golden record", "--seed"): options.seed,
    ("golden record", "--nproc"): options.processes,
    ("golden record", "--timeout"): options.positive_float,
    ("golden check", "--nproc"): options.processes,
    ("golden check", "--timeout"): options.positive_float,
    ("cache explain-miss", "--ranks"): options.count,
    ("cache unpack", "--max-size"): options.size,
}


def _numeric_flags() -> dict[tuple[str, str], object]:
    """(command, flag) -> checker of every option whose values are numbers (or sizes)."""
    return {
        (command, action.option_strings[0]): action.type
        for command, parser in command_parsers().items()
        for action in parser._actions
        if action.option_strings and action.type in BAD
    }


def test_every_numeric_flag_is_checked():
    bare = [
        (command, action.option_strings[0])
        for command, parser in command_parsers().items()
        for action in parser._actions
        if action.type in (int, float)
    ]
    assert bare == []  # a flag parsed by int/float skips the range checks
    assert _numeric_flags() == NUMERIC


def _torchrepro(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


@pytest.mark.parametrize(
    "command, flag, value",
    [(command, flag, value) for (command, flag), checker in NUMERIC.items() for value in BAD[checker]],
)
def test_a_bad_number_is_a_usage_error_before_anything_runs(tmp_path, command, flag, value):
    (tmp_path / "train.py").write_text("print('ran')\n")
    given = [flag, value, "0"] if flag == "--ranks" else [f"{flag}={value}"]
    proc = _torchrepro(tmp_path, *command.split(), *given, "train.py")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert re.match(rf"torchrepro: error: argument {flag}(/--\S+)*: ", line), line  # (named by every spelling)
    assert repr(value) in line and "ran" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # nothing created


def _cores() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["check", "--nproc", "100000"],
            "argument --nproc: must be at most {limit} (4 per usable core, {cores} core(s) here",
        ),
        (
            ["drift", "--jobs", "100000"],
            "argument --jobs: must be at most {limit} (4 per usable core, {cores} core(s) here",
        ),
        (
            ["doctor", "--fixes", "--jobs", "{half}", "--nproc", "3"],
            "--jobs {half} x --nproc 3 = {over} processes at once: ",
        ),
    ],
)
def test_processes_past_the_machines_bound_are_refused_before_anything_starts(tmp_path, argv, said):
    cores = _cores()
    values = {"limit": 4 * cores, "cores": cores, "half": 4 * cores // 3 + 1, "over": (4 * cores // 3 + 1) * 3}
    (tmp_path / "train.py").write_text("print('ran')\n")
    proc = _torchrepro(tmp_path, *[a.format(**values) for a in argv], "train.py")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("torchrepro: error: " + said.format(**values)), line
    assert "set TORCHREPRO_MAX_PROCESSES=N to allow more" in line and "ran" not in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # nothing created, nothing started


def test_torchrepro_max_processes_sets_the_bound(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("print('ran')\n")
    wanted = str(4 * _cores() + 1)
    monkeypatch.setenv("TORCHREPRO_MAX_PROCESSES", wanted)  # (a node with more devices than 4 per core)
    assert options.processes(wanted) == int(wanted)
    with pytest.raises(argparse.ArgumentTypeError, match=f"must be at most {wanted} \\(TORCHREPRO_MAX_PROCESSES"):
        options.processes(str(int(wanted) + 1))
    monkeypatch.setenv("TORCHREPRO_MAX_PROCESSES", "lots")
    proc = _torchrepro(tmp_path, "check", "--nproc", "2", "train.py")
    assert proc.returncode == 2 and "TORCHREPRO_MAX_PROCESSES must be an integer >= 1, got 'lots'" in proc.stderr


@pytest.mark.parametrize(
    "url, why",
    [
        ("localhost:4318", "no http:// or https:// scheme"),
        ("ftp://collector:4318", "no http:// or https:// scheme"),
        ("http://:4318", "no host name"),
        ("http://collector:99999", "Port out of range"),
        ("http://collector:0", "port 0"),
        ("http://collector:port", "Port could not be cast"),
        ("http://coll\x1b[2Jector:4318/v1", "a control or space character"),
    ],
)
def test_an_unusable_otlp_endpoint_is_a_usage_error_echoed_escaped(tmp_path, url, why):
    (tmp_path / "train.py").write_text("print('ran')\n")
    proc = _torchrepro(tmp_path, "doctor", "--otlp-endpoint", url, "train.py")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("torchrepro: error: argument --otlp-endpoint: give the collector's http(s) URL")
    assert why in line and "\x1b" not in line
    assert url.replace("\x1b", "\\x1b") in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.parametrize("url", ["http://localhost:4318", "https://collector.example:443/base", "http://[::1]:4318"])
def test_a_usable_otlp_endpoint_passes_unchanged(url):
    assert options.otlp_endpoint(url) == url
