"""The real-script corpus (realworld/): the upstream files are the upstream bytes, the ground-truth
counter wrapper counts what Dynamo counts, and (marker `realworld`, slow, `make realworld`) every
script passes its three checks: doctor's counts = Dynamo's counters, check's verdict = what two
plain runs printed, doctor leaves the printed losses unchanged."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RW = REPO / "realworld"
_spec = importlib.util.spec_from_file_location("realworld_run", RW / "run.py")
assert _spec and _spec.loader
corpus = importlib.util.module_from_spec(_spec)
sys.modules["realworld_run"] = corpus  # dataclasses look their module up while the class is built
_spec.loader.exec_module(corpus)

MANIFEST = json.loads((RW / "manifest.json").read_text())


def test_upstream_files_are_the_upstream_bytes() -> None:
    """Every file the manifest names is there with the sha256 recorded when it was copied."""
    changed = [p for p, digest in MANIFEST.items() if hashlib.sha256((RW / p).read_bytes()).hexdigest() != digest]
    assert changed == []


def test_every_script_folder_is_attributed() -> None:
    """Each folder holds only upstream files (all in the manifest), its LICENSE and UPSTREAM.md with the
    commit; every corpus entry's script is an upstream file."""
    entries = [*corpus.SCRIPTS, corpus.LLMC]
    folders = sorted({s.folder for s in entries})
    assert len({(s.folder, s.entry) for s in entries}) >= 6
    for folder in folders:
        upstream = (RW / folder / "UPSTREAM.md").read_text()
        assert "https://github.com/" in upstream and "commit" in upstream and "License" in upstream
        files = {
            str(p.relative_to(RW)) for p in (RW / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        }
        assert files - set(MANIFEST) == {f"{folder}/UPSTREAM.md"}
        assert f"{folder}/LICENSE" in MANIFEST
    for s in entries:
        assert f"{s.folder}/{s.entry}" in MANIFEST
    stubs_and_code = {"stubs", "__pycache__"}
    assert sorted(p.name for p in RW.iterdir() if p.is_dir() and p.name not in stubs_and_code) == folders


def test_printed_values_are_read_in_order() -> None:
    """The regex of a script picks what it printed, in order, every group that matched."""
    s = next(s for s in corpus.SCRIPTS if s.name == "nanoGPT")
    out = "step 0: train loss 4.1743, val loss 4.1782\niter 0: loss 4.1807, time 61.2ms, mfu -100.00%\n"
    assert corpus.printed(s, out) == ["0", "4.1743", "4.1782", "0", "4.1807"]


COUNTED = """
import torch

@torch.compile(backend="eager")
def f(x):
    return x * 2

@torch.compile(backend="eager")
def g(x):
    y = x + 1
    print("break")
    return y * 3

f(torch.ones(3))
f(torch.ones(3, dtype=torch.float64))
g(torch.ones(3))
"""


@pytest.mark.realworld
def test_ground_truth_wrapper_counts_what_dynamo_counts(tmp_path: Path) -> None:
    """realworld/dynamo_counters.py: a dtype recompile and a print() graph break, counted (docs/evidence/accuracy.md)."""
    script = tmp_path / "counted.py"
    script.write_text(COUNTED)
    out = tmp_path / "counts.json"
    env = {**os.environ, "PYTHONPATH": ""}
    p = subprocess.run(
        [sys.executable, str(RW / "dynamo_counters.py"), str(out), str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "break" in p.stdout
    counts = json.loads(out.read_text())
    assert counts == {"compiles": 4, "recompiles": 1, "graph_breaks": 1, "unique_graphs": 4, "dynamo_imported": True}


@pytest.mark.realworld
@pytest.mark.parametrize("name", [s.name for s in corpus.SCRIPTS])
def test_script_passes_its_three_checks(name: str, tmp_path: Path) -> None:
    """doctor's counts = Dynamo's, check's verdict = the plain runs' printed losses, doctor unperturbing, and
    the findings the script is known to earn (fsdp2: its blocks never initialised, the loss NaN)."""
    script = next(s for s in corpus.SCRIPTS if s.name == name)
    rec = corpus.check_script(script, tmp_path, timeout=1800, log=print)
    assert rec["counts_ok"], (rec["plain"]["counters"], rec["doctor"]["counts"])
    assert rec["verdict_ok"], (rec["plain_identical"], rec["check"])
    assert rec["unperturbed"] != "no", (rec["plain"]["printed"], rec["doctor"]["printed"])
    assert rec["findings_ok"], rec["findings"]  # the findings the script is known to earn, missed by doctor or check
    # an entry that evaluates under no_grad before it trains: the verdict against eager names the training graph
    assert rec.get("against_eager", {}).get("graph_ok", True), rec["against_eager"]


def test_the_training_graph_check_fails_a_verdict_that_names_the_evaluation_graph() -> None:
    """nanoGPT's entry says which compile id trains (0/1; 0/0 is estimate_loss() under no_grad): a first
    divergence of the gradients named in 0/0 fails the entry, one named in 0/1 passes, one that names
    no graph fails."""
    nanogpt = next(s for s in corpus.SCRIPTS if s.name == "nanoGPT")
    assert nanogpt.training_graph == "0/1" and nanogpt.compiled

    def report(what: str, compile_id: str | None) -> dict:
        return {"determinism": {"first_divergence": {"what": what, "compile_id": compile_id, "evidence": {}}}}

    assert corpus.training_graph_named(report("grads", "0/1"), "0/1")
    assert not corpus.training_graph_named(report("grads", "0/0"), "0/1")
    assert not corpus.training_graph_named(report("grads", None), "0/1")
    assert not corpus.training_graph_named({}, "0/1")  # no report: nothing named


def test_fabric_data_leaves_one_training_batch_per_rank(tmp_path: Path) -> None:
    """The prep step's data/wikitext-2.txt, tokenised as lightning.pytorch.demos.WikiText2 does (words
    plus <eos> per line, blocks of 35): after the script's fixed 4000 validation and test blocks, 40
    training blocks, one batch of 20 on each of the 2 ranks."""
    corpus.prep_wikitext2_mini(tmp_path)
    lines = (tmp_path / "data" / "wikitext-2.txt").read_text().splitlines()
    blocks = sum(len(line.split()) + 1 for line in lines) // 35 - 1
    assert blocks - 4000 == 40


PER_RANK = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")

@torch.compile(backend="eager")
def f(x):
    return x * 2

f(torch.ones(3))
if dist.get_rank() == 1:
    f(torch.ones(3, dtype=torch.float64))
dist.destroy_process_group()
"""


@pytest.mark.realworld
def test_ground_truth_wrapper_counts_each_rank_under_torchrun(tmp_path: Path) -> None:
    """Under torchrun each rank writes its own counters (`{rank}` in the file name); the totals the
    report is compared with are their sums: rank 1 alone recompiled."""
    script = tmp_path / "per_rank.py"
    script.write_text(PER_RANK)
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        + [str(RW / "dynamo_counters.py"), "counters-{rank}.json", str(script)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    total, ranks = corpus.dynamo_truth(tmp_path, 2)
    assert [ranks[r]["recompiles"] for r in ("0", "1")] == [0, 1]
    assert total == {"compiles": 3, "recompiles": 1, "graph_breaks": 0, "unique_graphs": 3}


def _torchrepro(r: corpus.Runner, label: str, *argv: str, env: dict[str, str] | None = None) -> tuple[str, dict]:
    """`torchrepro ARGV --out LABEL SCRIPT -- SCRIPT_ARGS` in the entry's work directory: its stderr and
    report.json."""
    r.env.update(env or {})
    outcome, report = r.torchrepro(label, *argv)
    assert report, outcome.tail()
    return outcome.stderr, report


@pytest.mark.realworld
def test_makemore_against_eager_compares_nothing_and_says_so_with_progress(tmp_path: Path) -> None:
    """makemore has no torch.compile switch and runs eager (Dynamo's counters: nothing compiled), so
    `check --against eager` has nothing to compare and says NOTHING COMPARED, never BIT-EXACT (its two
    runs, the same seeded eager run twice, agree on every step); while they go on, a progress line every
    second goes to the log."""
    full = next(s for s in corpus.SCRIPTS if s.name == "makemore")
    short = tuple(a for a in full.args if not a.startswith("--max-steps")) + ("--max-steps=21",)
    r = corpus.Runner(replace(full, args=short), tmp_path, timeout=900)
    r.prepare()
    r.plain("plain-counted", str(RW / "dynamo_counters.py"), "counters-{rank}.json", full.entry, *short)
    truth, _ = corpus.dynamo_truth(r.work, 1)
    assert truth["compiles"] == 0
    stderr, report = _torchrepro(
        r, "against-eager", "check", "--against", "eager", "--no-fixes", env={"TORCHREPRO_PROGRESS_S": "1"}
    )
    assert report["verdict"].startswith("NOTHING COMPARED: nothing was compiled"), report["verdict"]
    assert "the two runs agree over 21 step(s)" in report["verdict"]  # seeded: the same run twice
    assert re.search(r"^· eager: step \d+, \d+ s", stderr, re.M), stderr[-3000:]


@pytest.mark.realworld
def test_ddp_tutorial_resuming_from_its_snapshot_is_checked_run_against_run(tmp_path: Path) -> None:
    """The DDP tutorial on 2 gloo ranks saves snapshot.pt and resumes from it when it is there. Seeded
    (--seed 0), each run in its own fresh copy of the directory: BIT-EXACT over every step of both ranks,
    the user's directory left without the file. In place (TORCHREPRO_WORKDIR=shared) the second run
    resumes from the first's snapshot: the cause named is the shared file, never data order or seeding."""
    ddp = next(s for s in corpus.SCRIPTS if s.name == "ddp_tutorial")
    r = corpus.Runner(ddp, tmp_path, timeout=900)
    r.prepare()
    _, report = _torchrepro(r, "copied", "check", "--seed", "0", "--no-fixes")
    assert report["verdict"].startswith("BIT-EXACT"), report["verdict"]
    assert report["determinism"]["steps_compared"] == 2 * 4  # epochs × steps an epoch (each on both ranks)
    assert not (r.work / "snapshot.pt").exists()

    _, report = _torchrepro(r, "shared", "check", "--seed", "0", "--no-fixes", env={"TORCHREPRO_WORKDIR": "shared"})
    fd = report["determinism"]["first_divergence"]
    assert fd["cause"] == "shared_files", (report["verdict"], fd)
    assert {"path": "snapshot.pt", "written_by": "run-1", "read_by": "run-2"} in fd["evidence"]["files"]


@pytest.mark.realworld
def test_llmc_gpt2_against_eager_is_named_where_compiled_first_departs_at_bounded_disk(tmp_path: Path) -> None:
    """karpathy/llm.c's train_gpt2.py at GPT-2 small's shapes (124M parameters), compiled with inductor
    on the CPU: `check --against eager` names the op where the compiled forward first departs from
    eager (the first block's first LayerNorm), not the loss it reaches; its backward probe names a
    gradient; the forward graph (its inputs the weights, over 256 MiB) is probed but not saved for
    repro, and said so; once decided the check directory holds at most two parameter copies plus
    1 MB a snapshot step of each run. Its output goes to files in the script's directory (as
    `> log` would): not a file the runs shared."""
    r = corpus.Runner(corpus.LLMC, tmp_path, timeout=3000)
    r.prepare()
    _, report = _torchrepro(r, "against-eager", "check", "--against", "eager", "--no-fixes")
    det = report["determinism"]
    fd = det["first_divergence"]
    assert (fd["cause"], fd["evidence"]["localisation"]) == ("numerics", "compiled_graph"), report["verdict"]
    assert fd["module"] == "transformer.h.0.ln_1 (LayerNorm)", report["verdict"]
    block = (RW / "llmc" / "train_gpt2.py").read_text().splitlines().index("        x = x + self.attn(self.ln_1(x))")
    assert fd["source"].endswith(f"train_gpt2.py:{block + 1}") and "forward" in fd["op"]
    probes = {p["graph"]: p for p in det["graph_probes"]}
    assert probes["backward"]["eager_differing"] and probes["backward"]["eager_explained"]["parameter"]
    assert "more than 256 MiB" in probes["forward"]["not_saved"] and probes["forward"]["error"] is None
    out = r.work / "against-eager"
    page = (out / "report.html").read_text()
    assert "not saved for torchrepro repro: ValueError: its inputs take more than 256 MiB" in page
    assert "not probed" not in page
    copy = 124_439_808 * 4  # the parameters as train_gpt2.py counts them, float32
    held = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    runs = [p for p in out.iterdir() if p.is_dir()]
    steps = det["steps_compared"]
    assert held <= 2 * copy + len(runs) * steps * 2**20, (held, len(runs), steps)
