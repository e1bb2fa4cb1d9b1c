"""``torchrepro compare``: configuration B judged against configuration A's run-to-run band, on
event logs built in memory, and its command line (the command end to end on real scripts:
tests/e2e/test_compare_runs.py)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from torchrepro.analysis.equivalence import (
    AMBIGUOUS,
    Config,
    compare_report,
    judge,
    rank_divergences,
    repeated_batches,
    tolerance,
)
from torchrepro.analysis.verdict import Ending
from torchrepro.cli import main
from torchrepro.eventlog.event_reader import EventLog
from torchrepro.eventlog.events import End, Header, Params, Step
from torchrepro.eventlog.snapshot_files import fingerprints
from torchrepro.render.html import render_html
from torchrepro.reports.loader import load_report
from torchrepro.render.terminal import render_compare


NAMES = ["0.weight", "0.bias"]


def config(
    root: Path,
    label: str,
    losses: list[float],
    *,
    rank: int = 0,
    world: int = 1,
    param_fps: list[list[str]] | None = None,
    batches: list[str] | None = None,
    first: int = 0,
) -> EventLog:
    """One rank's log: ``losses`` per step from step ``first``, parameter fingerprints and batch fingerprints."""
    events: list = [
        Header(rank=rank, world_size=world),
        Params(rank=rank, names=NAMES, shapes=[[4, 8], [4]], dtypes=["float32"] * 2, kinds=["tensor"] * 2),
    ]
    for i, loss in enumerate(losses):
        fps = param_fps[i] if param_fps else ["p0", "p1"]
        events.append(
            Step(
                rank=rank,
                step=first + i,
                index=first + i,
                loss=loss,
                param_fps=fps,
                params_fp="".join(fps),
                grads_fp="g",
                batch_fp=batches[i] if batches else f"b{first + i}-{rank}",
                batches=1,
            )
        )
    events.append(End(rank=rank))
    return EventLog(root / label / f"rank-{rank}" / "events.jsonl", events=events)


def cfg(label: str, *logs: EventLog, problems: tuple[str, ...] = ()) -> Config:
    return Config(label, list(logs), Ending(label, problems=list(problems)))


LOSSES = [1.0, 0.9, 0.8, 0.7, 0.6]


def scaled(values: list[float], rel: list[float]) -> list[float]:
    return [v * (1 + r) for v, r in zip(values, rel)]


def test_a_bit_exact_reference_holds_b_to_the_reassociation_tolerance(tmp_path):
    a1, a2 = config(tmp_path, "a1", LOSSES), config(tmp_path, "a2", LOSSES)
    n_tol = tolerance(0, 2**-23, 8)  # fan-in 8, one partial gradient per step
    near = config(tmp_path, "b", scaled(LOSSES, [0.5 * n_tol] * 5), param_fps=[["q0", "p1"]] * 5)
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", near))
    assert section["verdict"] == "equivalent", section["reason"]
    assert section["band"]["zero"] and section["tolerance"]["reduction_size"] == 8
    assert not section["bit_exact"]  # the parameters' bits differ: equivalent, not bit-exact
    beyond = config(tmp_path, "b2", scaled(LOSSES, [0, 0, 3 * tolerance(2, 2**-23, 8), 0, 0]))
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", beyond))
    assert section["verdict"] == "abstain" and section["first_ambiguous"]["step"] == 2
    assert "measured noise" in section["decide"]
    far = config(tmp_path, "b3", scaled(LOSSES, [0, 0, 0, 2 * AMBIGUOUS * tolerance(3, 2**-23, 8), 0]))
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", far))
    assert section["verdict"] == "different" and section["first_out"]["step"] == 3
    assert section["first_out"]["quantity"] == "loss" and section["first_out"]["governed_by"] == "tolerance"


def test_a_measured_band_is_widened_and_b_judged_against_it(tmp_path):
    noise = [0, 1e-3, 0, 0, 0]  # the reference's own run-to-run difference (a nondeterministic kernel)
    a1, a2 = config(tmp_path, "a1", LOSSES), config(tmp_path, "a2", scaled(LOSSES, noise))
    inside = config(
        tmp_path, "b", scaled(LOSSES, [0, 2e-3, 5e-3, 8e-3, 0])
    )  # the band is an envelope: kept after step 1
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", inside))
    assert section["verdict"] == "equivalent" and not section["band"]["zero"]
    assert section["series"][3]["allowed_rel"] == pytest.approx(10 * 1e-3 * 0.9, rel=1e-6)
    beyond = config(tmp_path, "b2", scaled(LOSSES, [0, 2e-3, 3e-2, 0, 0]))  # 2.7x the band: one sample of it
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", beyond))
    assert section["verdict"] == "abstain" and "measured band at step 2" in section["reason"]
    outside = config(tmp_path, "b3", scaled(LOSSES, [0, 2e-3, 0.2, 0, 0]))
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", outside))
    assert section["verdict"] == "different" and section["first_out"]["step"] == 2
    assert section["first_out"]["governed_by"] == "band"


def test_too_wide_a_band_or_too_few_steps_abstains(tmp_path):
    a1 = config(tmp_path, "a1", LOSSES)
    noisy = config(tmp_path, "a2", scaled(LOSSES, [0, 0.2, 0, 0, 0]))
    section = judge(cfg("a-1", a1), cfg("a-2", noisy), cfg("b", config(tmp_path, "b", LOSSES)))
    assert section["verdict"] == "abstain" and "too wide" in section["reason"]
    short = [config(tmp_path, x, LOSSES[:2]) for x in ("s1", "s2", "s3")]
    section = judge(*(cfg(x, log) for x, log in zip(("a-1", "a-2", "b"), short)))
    assert section["verdict"] == "abstain" and "fewer than 3" in section["reason"]


def test_it_is_never_equivalent_on_steps_not_compared_or_a_run_that_failed(tmp_path):
    a1, a2 = config(tmp_path, "a1", LOSSES), config(tmp_path, "a2", LOSSES)
    stopped = config(tmp_path, "b", LOSSES[:3])  # B agrees bit for bit on the 3 steps it ran
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", stopped))
    assert section["verdict"] == "abstain" and "not compared" in section["reason"]
    failed = cfg("b", config(tmp_path, "b2", LOSSES), problems=("rank 0: crashed (exit code 1)",))
    section = judge(cfg("a-1", a1), cfg("a-2", a2), failed)
    report = compare_report(section, {}, {}, {})
    assert section["verdict"] == "abstain" and report.exit_code == 3  # as a check's incomplete
    resumed = config(tmp_path, "b3", LOSSES[2:], first=2)  # a resumed run: it starts at its checkpoint
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", resumed))
    assert section["verdict"] == "equivalent" and section["first_step"] == 2
    assert any("steps 0-1 of A were not compared" in n for n in section["notes"])


def test_each_rank_gets_its_first_divergence_with_the_strength_of_its_evidence(tmp_path):
    same = [["p0", "p1"]] * 5
    a = [config(tmp_path, "a", LOSSES, rank=r, world=2, param_fps=same) for r in (0, 1)]
    param = [["p0", "p1"], ["p0", "p1"], ["p0", "X"], ["p0", "X"], ["p0", "X"]]
    b0 = config(tmp_path, "b", LOSSES, rank=0, world=2, param_fps=param)  # 0.bias's fingerprint after step 2
    b1 = config(tmp_path, "b", scaled(LOSSES, [0, 1e-7, 0, 0, 0]), rank=1, world=2, param_fps=same)
    rows = {r["rank"]: r for r in rank_divergences(cfg("a-1", *a), cfg("b", b0, b1))}
    assert (rows[0]["status"], rows[0]["evidence"], rows[0]["step"]) == ("diverged", "direct", 2)
    assert (rows[0]["what"], rows[0]["tensor"], rows[0]["module"]) == ("params", "0.bias", "0")
    assert (rows[1]["evidence"], rows[1]["what"], rows[1]["step"]) == ("inferred", "loss", 1)
    # a rank B does not have; and a rank whose parameters were not fingerprinted: never "identical"
    unprinted = config(tmp_path, "c", LOSSES, rank=0, world=2)
    for step in unprinted.of(Step):
        step.param_fps = step.params_fp = step.grads_fp = None
    rows = {r["rank"]: r for r in rank_divergences(cfg("a-1", *a), cfg("b", unprinted))}
    assert (rows[0]["status"], rows[0]["evidence"]) == ("unknown", "absent")
    assert "not recorded" in rows[0]["note"]
    assert (rows[1]["evidence"], rows[1]["note"]) == ("absent", "b has no rank 1")
    rows = rank_divergences(cfg("a-1", *a), cfg("b", *a))
    assert [(r["status"], r["evidence"]) for r in rows] == [("identical", "direct")] * 2


def test_batches_seen_twice_are_reported_and_make_b_different(tmp_path):
    a = [config(tmp_path, "a", LOSSES, rank=r, world=2, batches=[f"b{i}{r}" for i in range(5)]) for r in (0, 1)]
    wrong_rank = [config(tmp_path, "w", LOSSES, rank=r, world=2, batches=[f"b{i}0" for i in range(5)]) for r in (0, 1)]
    repeats = repeated_batches(cfg("b", *wrong_rank))
    assert repeats[0] == {"kind": "same_batch_on_ranks", "step": 0, "rank": 1, "first_step": 0, "first_rank": 0}
    no_epoch = [
        config(tmp_path, "e", LOSSES, rank=r, world=2, batches=[f"b{i % 2}{r}" for i in range(5)]) for r in (0, 1)
    ]
    assert repeated_batches(cfg("b", *no_epoch))[0]["kind"] == "batch_repeated"
    section = judge(cfg("a-1", *a), cfg("a-2", *a), cfg("b", *no_epoch))
    first = section["first_out"]
    assert section["verdict"] == "different" and (first["quantity"], first["step"], first["rank"]) == ("batch", 2, 0)
    report = compare_report(section, {}, {}, {})
    assert "REPEATED_BATCHES" in {f.code for f in report.findings}


def test_parameter_tensors_are_compared_from_snapshots_and_joined_from_shards(tmp_path):
    """A sharded configuration (FSDP2: each rank holds rows of each tensor) against a replicated one:
    the shards are joined; the first tensor out of the band is named with its module."""
    rng = np.random.default_rng(0)
    full = [
        {"0.weight": rng.standard_normal((4, 8)).astype(np.float32), "0.bias": np.ones(4, np.float32)} for _ in LOSSES
    ]

    def snapshot(log: EventLog, arrays: list[dict[str, np.ndarray]]) -> None:
        """Each step's snapshot, its fingerprints recorded in the step log as a run records them
        (a snapshot whose values do not match them is damage: never compared)."""
        folder = log.path.parent / "snapshots"
        folder.mkdir(parents=True)
        for i, a in enumerate(arrays):
            np.savez(folder / f"step-{i:07d}.npz", **a)
            log.of(Step)[i].param_fps = [next(fingerprints(a[name], ["float32"])) for name in NAMES]

    a = [config(tmp_path, x, LOSSES) for x in ("a1", "a2")]
    for log in a:
        snapshot(log, full)
    shards = []
    for r in (0, 1):
        log = config(tmp_path, "b", LOSSES, rank=r, world=2)
        log.of(Params)[0].kinds = ["dtensor:S(0)"] * 2
        changed = [{k: v[2 * r : 2 * r + 2].copy() for k, v in f.items()} for f in full]
        if r == 1:
            changed[3]["0.bias"][0] += 0.5  # a row rank 1 holds, after step 3
        snapshot(log, changed)
        shards.append(log)
    section = judge(cfg("a-1", a[0]), cfg("a-2", a[1]), cfg("b", *shards))
    assert section["tensors_compared"] == 10
    first = section["first_out"]
    assert section["verdict"] == "different" and (first["step"], first["tensor"], first["module"]) == (3, "0.bias", "0")
    assert math.isclose(first["diff_rel"], 0.5)


def test_the_report_reads_back_renders_and_keeps_its_schema(tmp_path):
    a1, a2 = config(tmp_path, "a1", LOSSES), config(tmp_path, "a2", LOSSES)
    section = judge(cfg("a-1", a1), cfg("a-2", a2), cfg("b", config(tmp_path, "b", scaled(LOSSES, [0, 0, 1, 0, 0]))))
    report = compare_report(section, {"a-1": "x"}, {"a-1": 1.0}, {"script": "train.py"})
    data = json.loads(json.dumps(report.to_json()))
    again = load_report(data)  # checks the document against reports/schemas/compare.schema.json
    assert again.exit_code == 1 and again.verdict_line.startswith("DIFFERENT at step 2")
    page = render_html(again)
    assert "First divergence of each rank" in page and "DIFFERENT at step 2" in page
    out = io.StringIO()
    render_compare(again, Console(file=out, width=200))
    assert "DIFFERENT at step 2" in out.getvalue() and "first divergence per rank" in out.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["a.py", "--x"], "compare needs two configurations"),
        (["a.py", "::"], "no script after '::'"),
        (["a.py", "::", "missing.py"], "no such script: missing.py"),
    ],
)
def test_a_command_line_without_two_configurations_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.py").write_text("pass\n")
    assert main(["compare", "--out", str(tmp_path / "r"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("torchrepro: error: ") and message in err[0]
