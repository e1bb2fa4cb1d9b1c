"""The command line run for real, as a new user types it: pipes closed early (``| head -1``), one
document on stdout (``--json -``), options after the script, modules run with ``-m``, JUnit from
the commands CI gates on, reports without the home directory (how each is parsed:
tests/unit/test_command_line.py). Real processes, real pipes, real runs of small eager scripts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
from test_hostile_input import fake_run

TRAIN = """\
import sys

import torch

print("argv", sys.argv[1:], flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
for line in range(2000):  # more than a pipe holds
    print("line", line)
"""
MODULE = """\
import sys

import torch

from .settings import STEPS

print("running", __spec__.name, "in package", __package__, "argv", sys.argv[1:], flush=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(STEPS):
    loss = model(torch.ones(2, 4)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def torchrepro(*args: object, cwd: Path, env: dict[str, str] | None = None, **how) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *map(str, args)],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        text=True,
        timeout=300,
        **({"capture_output": True} | how),
    )


@pytest.fixture
def project(tmp_path) -> Path:
    """A project: ``train.py``, and ``pkg/train.py`` (a module of a package, importing its sibling)."""
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "settings.py").write_text("STEPS = 3\n")
    (tmp_path / "pkg" / "train.py").write_text(MODULE)
    return tmp_path


def closed_pipe(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    """torchrepro writing into a pipe whose reader is already gone."""
    read, write = os.pipe()
    os.close(read)
    try:
        return torchrepro(*args, cwd=cwd, stdout=write, stderr=subprocess.PIPE, capture_output=False)
    finally:
        os.close(write)


def assert_quiet(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 141, proc.stderr[-3000:]  # 128 + SIGPIPE, never 1 (analysed and fails)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "args",
    [
        ["env", "--json"],
        ["env"],
        ["report", "RUN"],
        ["report", "RUN", "--json", "-"],
        ["report", "RUN", "--junit", "-"],
    ],
)
def test_a_closed_pipe_ends_quietly(tmp_path, args):
    fake_run(tmp_path / "RUN")
    assert_quiet(closed_pipe(*args, cwd=tmp_path))


@pytest.mark.parametrize("command", ["report RUN", "doctor --out d train.py"])
def test_head_1_takes_the_first_line_and_torchrepro_ends_quietly(project, command):
    fake_run(project / "RUN")
    shell = f'{sys.executable} -m torchrepro {command} | head -1; echo "status ${{PIPESTATUS[0]}}" >&2'
    proc = subprocess.run(["bash", "-c", shell], cwd=project, capture_output=True, text=True, timeout=300)
    assert len(proc.stdout.splitlines()) == 1 and proc.stdout.strip()
    assert proc.stderr.splitlines()[-1] in ("status 0", "status 141"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


def test_doctor_budget_after_the_script_is_said_and_stdout_holds_the_json_alone(project):
    """A budget typed after the script is the script's (it may take one of that name): said in one
    warning line, never silently dropped. With ``--json -`` stdout is the report alone (the
    script's output and the verdict on stderr), and what is stored names no directory of this
    machine: the working directory relative, the home directory as ``~``."""
    home = project / "home"
    env = {"HOME": str(home)}
    proc = torchrepro(
        "doctor", "--out", "run", "--json", "-", "--junit", home / "j.xml", "train.py", "--max-recompiles", "0",
        cwd=project, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("torchrepro: warning:")]
    assert warnings == [
        "torchrepro: warning: --max-recompiles after train.py is the script's, not torchrepro doctor's: put it "
        "before train.py to give it to torchrepro (write train.py -- ARGS when they are the script's)"
    ]
    assert "argv ['--max-recompiles', '0']" in proc.stderr and "HEALTHY" in proc.stderr  # all of it on stderr
    report = json.loads(proc.stdout)
    assert report == json.loads((project / "run" / "report.json").read_text())
    stored = [proc.stdout, (project / "run" / "report.html").read_text(), (home / "j.xml").read_text()]
    assert all(str(project) not in text for text in stored)
    assert report["run"]["cwd"] == "." and report["provenance"]["script"] == "train.py"
    again = torchrepro("report", "run", "--absolute-paths", "--json", "-", cwd=project, env=env)
    assert json.loads(again.stdout)["run"]["cwd"] == str(project)


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_module_runs_as_python_m_runs_it(project):
    proc = torchrepro("doctor", "--out", "run", "-m", "pkg.train", "--seed", "3", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running pkg.train in package pkg argv ['--seed', '3']" in proc.stdout  # its relative import worked
    assert "--seed after -m pkg.train is the script's" in proc.stderr
    report = json.loads((project / "run" / "report.json").read_text())
    assert report["steps"]["steps"] == 3 and report["provenance"]["script"] == "pkg/train.py"
    alone = torchrepro("run", "--out", "alone", "-m", "pkg.train", cwd=project)  # as under your own torchrun
    assert alone.returncode == 0 and "running pkg.train in package pkg" in alone.stdout, alone.stderr[-3000:]
    assert (project / "alone" / "rank-0" / "events.jsonl").is_file()


def test_check_a_module_with_a_junit_file_for_ci(project):
    proc = torchrepro("check", "--out", "c", "--junit", "c.xml", "-m", "pkg.train", cwd=project)
    assert proc.returncode == 0 and proc.stdout.startswith("BIT-EXACT"), proc.stderr[-3000:]
    logs = [(project / "c" / run / "logs" / "stdout.log").read_text() for run in ("run-1", "run-2")]
    assert all("running pkg.train in package pkg" in log for log in logs)
    suite = ElementTree.parse(project / "c.xml").getroot()
    cases = [(c.get("name"), c.find("failure")) for c in suite.iter("testcase")]
    assert cases == [("run-1 vs run-2", None), ("run-1 ended normally", None), ("run-2 ended normally", None)]
    assert suite.get("name") == "torchrepro check" and suite.get("failures") == "0"


def test_diff_junit_fails_with_the_verdict_line(tmp_path):
    fake_run(tmp_path / "a")
    fake_run(tmp_path / "b", steps=[{"index": i, "loss": 2.0, "time_s": 0.01} for i in range(3)])
    proc = torchrepro("diff", "a", "b", "--junit", "-", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    suite = ElementTree.fromstring(proc.stdout)  # stdout is the XML alone; the verdict went to stderr
    [failure] = suite.iter("failure")
    verdict = proc.stderr.splitlines()[0]
    assert verdict.startswith("DIVERGED") and failure.get("message") == verdict
    assert failure.text.splitlines()[0] == verdict


@pytest.mark.slow  # A twice and B once, then drift's four runs: make test-slow
def test_compare_and_drift_run_modules_on_both_sides(project):
    (project / "pkg" / "other.py").write_text(MODULE)
    proc = torchrepro(
        "compare", "--out", "cmp", "--junit", "cmp.xml", "-m", "pkg.train", "::", "-m", "pkg.other", cwd=project
    )
    assert proc.returncode == 0 and "EQUIVALENT" in proc.stdout, proc.stderr[-3000:]
    said = {run: (project / "cmp" / run / "logs" / "stdout.log").read_text() for run in ("a-1", "a-2", "b")}
    assert "running pkg.other" in said["b"] and all("running pkg.train" in said[r] for r in ("a-1", "a-2"))
    assert [c.get("name") for c in ElementTree.parse(project / "cmp.xml").getroot()][
        0
    ] == "B within A's run-to-run band"
    drift = torchrepro(
        "drift", "--out", "exp", "--runs", "2", "--vary", "compile", "--jobs", "1", "-m", "pkg.train", cwd=project
    )
    assert drift.returncode == 0, drift.stderr[-3000:]
    assert json.loads((project / "exp" / "plan.json").read_text())["module"] == "pkg.train"
    logs = list((project / "exp").glob("runs/*/logs/stdout.log"))
    assert len(logs) == 4 and all("running pkg.train" in log.read_text() for log in logs)


def test_env_and_watch_write_json_to_a_file_or_stdout(tmp_path):
    run = fake_run(tmp_path / "RUN")
    written = torchrepro("env", "--json", "env.json", cwd=tmp_path)
    assert (
        written.returncode == 0
        and written.stdout == ""
        and json.loads((tmp_path / "env.json").read_text())["versions"]["torch"]
    )
    refused = torchrepro("env", "--json", "env.json", cwd=tmp_path)  # never over a file without --force
    assert refused.returncode == 2 and refused.stderr.startswith("torchrepro: error:")
    printed = torchrepro("env", "--json", cwd=tmp_path)  # --json alone, as before: stdout
    assert json.loads(printed.stdout)["versions"] == json.loads((tmp_path / "env.json").read_text())["versions"]
    snap = torchrepro("watch", run, "--once", "--json", "snap.json", cwd=tmp_path)
    assert snap.returncode == 0 and json.loads((tmp_path / "snap.json").read_text())["ranks"]
