"""examples/train_digits.py under `torchrepro doctor`: each pitfall is found where it is, the clean
script is clean, and capture changes nothing (bit-identical parameters, same number of graphs)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_digits.py"
ITEM_LINE = next(i for i, line in enumerate(SCRIPT.read_text().splitlines(), 1) if "PITFALL --pitfall-item" in line)


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=dict(os.environ), timeout=240)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def doctor(tmp: Path, *script_args: str) -> tuple[dict, str]:
    """The report of ``torchrepro doctor`` on the script, and what doctor printed (it shows the
    script's own output live)."""
    out = tmp / "run"
    proc = _run([sys.executable, "-m", "torchrepro", "doctor", "--out", str(out), str(SCRIPT), "--", *script_args], tmp)
    return json.loads((out / "report.json").read_text()), proc.stdout


def graphs_printed(stdout: str) -> int:
    return int(re.search(r"^compiled graphs: (\d+)$", stdout, re.M).group(1))


def test_make_test_runs_the_pitfalls_as_readme_shows_them():
    """The test below is in the slow tier because README.md's example runs the same doctor command in
    `make test` (tests/e2e/test_docs_examples.py) and compares every finding and fix it prints: the
    shape recompile's drop_last, the .item() break at its line, the grad_mode and temperature
    recompiles with allow_unspec_int_on_nn_module. Without that example, the test goes back."""
    from docs_examples import examples

    shown = [c for e in examples(REPO / "README.md") if e.tier == "make test" for c in e.commands]
    assert any(c.text == "torchrepro doctor examples/train_digits.py -- --pitfalls --epochs 2" for c in shown)
    assert any(line.startswith(" ! graph break at examples/train_digits.py:") for c in shown for line in c.shown)


@pytest.mark.slow  # README.md's example covers it in make test (above)
def test_pitfalls_are_found_with_fixes(tmp_path):
    # Two epochs: the int attribute takes a second value only in the second epoch.
    report, _ = doctor(tmp_path, "--epochs", "2", "--pitfalls")
    c, findings = report["compile"], report["findings"]
    events = c["recompile_events"]

    shape = [f for f in findings if f["code"] == "RECOMPILE_SHAPE"]
    assert shape and any("drop_last" in f["hint"] for f in shape), shape

    breaks = [f for f in findings if f["code"] == "GRAPH_BREAK"]
    assert any(f["evidence"]["location"].endswith(f"train_digits.py:{ITEM_LINE}") for f in breaks), breaks
    assert any(".item()" in f["hint"] for f in breaks)

    evals = [
        e
        for e in events
        if e["category"] == "grad_mode" or (e["category"] == "module_attribute" and ".training" in e["guard"])
    ]
    assert evals, events

    temperature = [e for e in events if e["category"] == "module_attribute" and "temperature" in e["guard"]]
    assert temperature, events
    assert any(
        f["code"] == "RECOMPILE_MODULE_ATTRIBUTE" and "allow_unspec_int_on_nn_module" in f["hint"] for f in findings
    )
    assert report["run"]["exit_code"] == 0 and not report["budget_failures"]


@pytest.mark.slow  # two runs of the example; test_doctor_cli's perturbation test stays in make test
def test_clean_script_is_clean_and_capture_changes_nothing(tmp_path):
    """Without pitfalls: one graph, no recompile, no graph break. And the same script with the
    same --seed, alone and under doctor (without doctor's own --seed), ends with bit-identical
    parameters and compiles the same number of graphs. (One test: two runs cost ~20 s.)"""
    import torch

    plain = _run([sys.executable, str(SCRIPT), "--epochs", "1", "--seed", "3", "--save-params", "plain.pt"], tmp_path)
    report, doctor_stdout = doctor(tmp_path, "--epochs", "1", "--seed", "3", "--save-params", "doctor.pt")

    c = report["compile"]
    assert (c["compiles"], c["recompiles"], c["graph_breaks"]) == (1, 0, 0), c
    assert report["verdict"].startswith("HEALTHY"), report["verdict"]
    assert report["steps"]["steps"] == 1437 // 64

    a = torch.load(tmp_path / "plain.pt", weights_only=True)
    b = torch.load(tmp_path / "doctor.pt", weights_only=True)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]

    assert graphs_printed(plain.stdout) == graphs_printed(doctor_stdout) == 1
    assert c["compiles"] == c["unique_graphs"] == graphs_printed(plain.stdout)


def test_synthetic_fallback_without_sklearn(monkeypatch, capsys):
    spec = importlib.util.spec_from_file_location("train_digits", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # makes the import fail
    x_train, y_train, x_test, y_test = module.load_data(0)
    assert tuple(x_train.shape) == (1437, 1, 8, 8) and tuple(x_test.shape) == (360, 1, 8, 8)
    assert int(y_train.max()) <= 9
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "synthetic" in err
