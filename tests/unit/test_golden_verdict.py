"""Golden runs without running anything: the manifest read back with the run-directory guards
(a golden directory comes from someone else), and what a golden check may conclude from the
environments it compares (:mod:`torchrepro.analysis.golden_verdict`)."""

from __future__ import annotations

import json
import os

import pytest

from synthetic_runs import write_run
from torchrepro.analysis.golden_verdict import (
    NOT_RUN,
    comparable,
    differences,
    environment_of,
    golden_findings,
    golden_verdict,
    still_possible,
)
from torchrepro.errors import InputError
from torchrepro.eventlog.golden_dir import GOLDEN_FILE, GOLDEN_SCHEMA, load_golden_runs, read_manifest
from torchrepro.reports.findings import Verdict


def manifest(**changes):
    data = {
        "schema": GOLDEN_SCHEMA,
        "recorded_at": "2026-01-01T00:00:00+0000",
        "torchrepro_version": "0.4.0",
        "torch_version": "2.13.0+cpu",
        "python_version": "3.11.7",
        "device": "cpu (x86_64, AVX2)",
        "world_size": 1,
        "script": "train.py",
        "script_sha256": "a" * 64,
        "args": ["--steps", "20"],
        "seed": None,
        "nproc": 1,
        "steps": 20,
        "runs": ["reference"],
        "run_to_run": None,
        "snapshot_budget": 0,
        "sizes": {
            "bytes": 1,
            "fixed": 1,
            "steps": 20,
            "parameters": 4,
            "per_step": 1.0,
            "per_parameter_step": 1.0,
            "snapshot_bytes": 0,
        },
    }
    return {**data, **changes}


def golden_dir(tmp_path, **changes):
    root = tmp_path / "golden"
    write_run(root / "reference", 1, steps=5)
    (root / GOLDEN_FILE).write_text(json.dumps(manifest(**changes)))
    return root


def test_a_golden_directory_reads_back_with_its_runs(tmp_path):
    root = golden_dir(tmp_path)
    read = read_manifest(root)
    assert read["torch_version"] == "2.13.0+cpu"
    assert [run.path.name for run in load_golden_runs(root, read)] == ["reference"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda root: (root / GOLDEN_FILE).unlink(), "holds no golden.json: not a golden directory"),
        (lambda root: (root / GOLDEN_FILE).write_text("{not json"), "not JSON"),
        (
            lambda root: (root / GOLDEN_FILE).write_text('{"schema": "other.tool/1"}'),
            "not a torchrepro golden manifest",
        ),
        (lambda root: (root / GOLDEN_FILE).write_text(json.dumps(manifest(world_size="2"))), "world_size"),
        (lambda root: (root / GOLDEN_FILE).write_text(json.dumps(manifest(runs=["../../etc"]))), "runs"),
        (lambda root: (root / GOLDEN_FILE).write_text(json.dumps(manifest(runs=["reference-2"]))), "not ['reference']"),
        (lambda root: (root / GOLDEN_FILE).write_bytes(b" " * (65 << 20)), "over 64 MiB"),
    ],
)
def test_a_damaged_or_foreign_manifest_is_one_clear_error(tmp_path, damage, message):
    root = golden_dir(tmp_path)
    damage(root)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_manifest(root)


def test_links_in_a_golden_directory_are_not_followed(tmp_path):
    root = golden_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (root / "reference").rename(elsewhere)
    os.symlink(elsewhere, root / "reference")
    with pytest.raises(InputError, match="symbolic link"):
        load_golden_runs(root, read_manifest(root))
    os.symlink(root, tmp_path / "linked")
    with pytest.raises(InputError, match="symbolic link"):
        read_manifest(tmp_path / "linked")


def test_a_fifo_for_a_manifest_is_refused_without_blocking(tmp_path):
    root = golden_dir(tmp_path)
    (root / GOLDEN_FILE).unlink()
    os.mkfifo(root / GOLDEN_FILE)
    with pytest.raises(InputError, match="not a regular file"):
        read_manifest(root)


def test_another_torch_without_a_band_is_not_comparable_and_says_what_would_be():
    recorded = environment_of(manifest(torch_version="2.6.0+cpu"))
    here = {"torch_version": "2.13.0+cpu", "device": NOT_RUN, "world_size": 1}
    found = differences(recorded, here)
    assert found == [{"what": "torch_version", "recorded": "2.6.0+cpu", "here": "2.13.0+cpu"}]
    assert not comparable(found, band=False) and comparable(found, band=True)
    possible = still_possible(found, False, manifest(torch_version="2.6.0+cpu"))
    assert "WITHIN BAND, against a golden recorded with its band" in possible and "torch 2.6.0+cpu" in possible
    verdict, line = golden_verdict("golden", found, possible, False, None, None)
    assert verdict is Verdict.NOT_COMPARABLE and verdict.tone == "warn" and not verdict.passing
    assert line.startswith("NOT COMPARABLE with golden golden: recorded with torch 2.6.0+cpu, here 2.13.0+cpu")
    assert line.endswith(f"still possible: {possible}")


def test_another_world_size_is_never_comparable_even_with_a_band():
    found = differences(environment_of(manifest()), {"torch_version": "2.13.0+cpu", "device": NOT_RUN, "world_size": 2})
    assert [d["what"] for d in found] == ["world_size"] and not comparable(found, band=True)
    assert "golden check --nproc 1" in still_possible(found, True, manifest())


def test_a_device_not_measured_yet_is_no_difference():
    here = {"torch_version": "2.13.0+cpu", "device": NOT_RUN, "world_size": 1}
    assert differences(environment_of(manifest()), here) == []
    assert still_possible([], False, manifest()) is None


def test_findings_name_a_changed_script_and_arguments():
    codes = [f.code for f in golden_findings(manifest(), "b" * 64, ["--steps", "10"], [])]
    assert codes == ["GOLDEN_SCRIPT_CHANGED", "GOLDEN_ARGS_CHANGED"]
    assert golden_findings(manifest(), "a" * 64, ["--steps", "20"], []) == []


def test_a_golden_report_round_trips_and_shows_hostile_text_escaped(tmp_path):
    from hostile_text import HOSTILE, MARKUP, assert_safe, assert_shown, text_console

    from torchrepro.commands.check.comparison import diff
    from torchrepro.render.golden_text import first_divergence_line, render_golden
    from torchrepro.render.html import render_html
    from torchrepro.reports.golden_report import GoldenReport
    from torchrepro.reports.loader import load_report

    golden = golden_dir(tmp_path)
    write_run(tmp_path / "run", 1, steps=5)
    check = diff(golden / "reference", tmp_path / "run")
    name = f"{golden}/{MARKUP}{HOSTILE}"
    found = [{"what": "device", "recorded": "cpu (x86_64, AVX2)", "here": f"cpu ({HOSTILE})"}]
    verdict, line = golden_verdict(name, [], None, False, check, None)
    assert verdict is Verdict.BIT_EXACT and line.startswith(f"BIT-EXACT against golden {name}: 5 step(s) agree")
    report = GoldenReport(name, verdict, line, environment_of(manifest()), environment_of(manifest()), found, None)
    report.check, report.run_dir = check, str(tmp_path / "run")
    again = load_report(json.loads(json.dumps(report.to_json())))
    assert again == report and again.exit_code == 0 and first_divergence_line(again) is None
    assert_safe(render_html(report))
    console, out = text_console()
    render_golden(report, console)
    assert_shown(out.getvalue().splitlines()[0])
    damaged = report.to_json()
    damaged["check"]["determinism"]["verdict"] = "fine"
    with pytest.raises(InputError, match="a damaged golden report"):
        load_report(damaged)
