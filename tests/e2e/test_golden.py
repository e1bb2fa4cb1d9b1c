"""``torchrepro golden record`` and ``golden check`` on real scripts: a golden directory small enough
to commit, judged BIT-EXACT, WITHIN BAND, DIVERGED (with the op named) or NOT COMPARABLE (nothing
run); an existing directory never taken over; a script that fails records nothing. The pytest
plugin over the same: tests/e2e/test_pytest_plugin.py; what is decided without running:
tests/unit/test_golden_verdict.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support import run_torchrepro
from torchrepro.reports.loader import load_report

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"


def files_of(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def test_record_then_check_bit_exact_and_what_is_refused(tmp_path):
    script = shutil.copy(SCRIPTS / "deterministic.py", tmp_path / "train.py")
    rec = run_torchrepro("golden", "record", "--out", "golden", "train.py", cwd=tmp_path)
    assert rec.returncode == 0, rec.stderr
    assert rec.stdout.startswith("GOLDEN RECORDED in golden: 5 step(s) of train.py, 1 rank(s), torch ")
    assert files_of(tmp_path / "golden") == [
        "golden.json",
        "reference/rank-0/events.jsonl",
        "reference/rank-0/steps.bin",
        "reference/run.json",
    ]
    manifest = json.loads((tmp_path / "golden" / "golden.json").read_text())
    assert manifest["sizes"]["bytes"] == sum(p.stat().st_size for p in (tmp_path / "golden").rglob("*") if p.is_file())
    assert manifest["sizes"]["bytes"] < 32_000 and manifest["steps"] == 5 and manifest["runs"] == ["reference"]

    check = run_torchrepro(
        "golden", "check", "--out", "run", "--json", "golden.report.json", "golden", "train.py", cwd=tmp_path
    )
    assert check.returncode == 0, check.stderr
    assert check.stdout.startswith("BIT-EXACT against golden golden: 5 step(s) agree bit for bit")
    report = load_report(json.loads((tmp_path / "run" / "report.json").read_text()))
    assert (
        report.kind == "golden" and report.verdict.value == "bit_exact" and report.check.determinism.steps_compared == 5
    )
    assert json.loads((tmp_path / "golden.report.json").read_text())["golden_verdict"] == "bit_exact"
    again = run_torchrepro("report", "run", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("BIT-EXACT against golden golden")

    # decided before anything runs: another number of ranks, another torch (no band to judge within)
    ranks = run_torchrepro("golden", "check", "--nproc", "2", "--out", "ranks", "golden", "train.py", cwd=tmp_path)
    assert ranks.returncode == 1 and ranks.stdout.startswith("NOT COMPARABLE with golden golden: recorded with world")
    assert "golden check --nproc 1" in ranks.stdout and not (tmp_path / "ranks").exists()
    shutil.copytree(tmp_path / "golden", tmp_path / "old-torch")
    edited = tmp_path / "old-torch" / "golden.json"
    edited.write_text(json.dumps({**manifest, "torch_version": "2.6.0+cpu"}))
    old = run_torchrepro("golden", "check", "--out", "old", "old-torch", "train.py", cwd=tmp_path)
    assert old.returncode == 1 and "recorded with torch 2.6.0+cpu" in old.stdout and not (tmp_path / "old").exists()

    # never taken over: a golden without --force, another directory at all; nothing is run for either
    for out, message in (("golden", "already holds a golden run: give --force"), ("run", "is not a golden directory")):
        refused = run_torchrepro("golden", "record", "--out", out, "train.py", cwd=tmp_path)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert json.loads((tmp_path / "golden" / "golden.json").read_text()) == manifest
    assert Path(script).exists()


def test_a_script_that_fails_records_nothing(tmp_path):
    (tmp_path / "fails.py").write_text("raise SystemExit('no data')\n")
    failed = run_torchrepro("golden", "record", "--out", "golden", "fails.py", cwd=tmp_path)
    last = failed.stderr.splitlines()[-1]
    assert failed.returncode == 3 and last.startswith("torchrepro: error: the script did not end normally"), last
    assert "SystemExit('no data')" in last and last.endswith("nothing recorded")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fails.py"]  # no golden, no half-written recording


@pytest.mark.slow  # five runs (two for the band, and replays): make test-slow
def test_noise_is_within_the_band_and_diverged_without_it_with_the_op_named(tmp_path):
    shutil.copy(SCRIPTS / "noise_module.py", tmp_path / "noise_module.py")
    assert run_torchrepro("golden", "record", "--out", "plain", "noise_module.py", cwd=tmp_path).returncode == 0
    diverged = run_torchrepro("golden", "check", "--out", "d", "plain", "noise_module.py", cwd=tmp_path)
    assert diverged.returncode == 1, diverged.stderr
    assert diverged.stdout.startswith("DIVERGED from golden plain at step 0 (rank 0, loss): cause rng")
    line = json.loads((tmp_path / "d" / "report.json").read_text())["verdict"]  # the terminal wraps it
    assert "cause rng — module Net.noise, op aten.randn.generator, at " in line and line.endswith("noise_module.py:9")

    shutil.copy(SCRIPTS / "tiny_noise.py", tmp_path / "tiny_noise.py")
    banded = run_torchrepro(
        "golden", "record", "--band", "--snapshot-budget", "64K", "--out", "band", "tiny_noise.py", cwd=tmp_path
    )
    assert banded.returncode == 0 and "run to run: DIVERGED" in banded.stdout, banded.stderr
    manifest = json.loads((tmp_path / "band" / "golden.json").read_text())
    assert manifest["runs"] == ["reference", "reference-2"] and 0 < manifest["sizes"]["snapshot_bytes"] <= 64 << 10
    within = run_torchrepro("golden", "check", "--out", "w", "band", "tiny_noise.py", cwd=tmp_path)
    assert within.returncode == 0, within.stdout + within.stderr
    assert within.stdout.startswith("WITHIN BAND of golden band: not bit for bit from step")
    assert not (tmp_path / "w" / "replays").exists()  # within the band: no replay was needed


UNSEEDED = """import torch
model = torch.nn.Linear(4, 1)  # initialised from an unseeded RNG: another model in every run
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_golden_divergence_shows_its_fix_under_the_verdict(tmp_path):
    """A golden check shows what its comparison found, as check does: the divergence's fix under the
    verdict, which says "from golden" before step 0 too."""
    (tmp_path / "unseeded.py").write_text(UNSEEDED)
    assert run_torchrepro("golden", "record", "--out", "golden", "unseeded.py", cwd=tmp_path).returncode == 0
    diverged = run_torchrepro("golden", "check", "--no-localize", "golden", "unseeded.py", cwd=tmp_path)
    lines = diverged.stdout.splitlines()
    assert diverged.returncode == 1, diverged.stdout + diverged.stderr
    assert lines[0].startswith("DIVERGED from golden golden before step 0 (rank 0, init_params)"), lines
    assert lines[1].startswith("   fix: The parameters differ before the first step"), lines
    assert lines[2].startswith("first divergence: before step 0, rank 0, init_params"), lines


@pytest.mark.slow  # two more runs: make test-slow
def test_a_golden_check_says_a_loss_that_is_nan_beside_bit_exact(tmp_path):
    """Two runs whose loss is NaN with the same bits are BIT-EXACT; the golden check says the loss is NaN."""
    shutil.copy(SCRIPTS / "nan_loss.py", tmp_path / "nan_loss.py")
    assert run_torchrepro("golden", "record", "--out", "golden", "nan_loss.py", cwd=tmp_path).returncode == 0
    nan = run_torchrepro("golden", "check", "golden", "nan_loss.py", cwd=tmp_path)
    assert nan.returncode == 0 and nan.stdout.startswith("BIT-EXACT against golden golden"), nan.stdout
    assert " ✗ the loss is NaN at step 0 (rank 0), the first that is not finite" in nan.stdout.splitlines()
