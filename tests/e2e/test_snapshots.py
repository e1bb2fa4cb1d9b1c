"""Parameter snapshots in disk bounded by the model: count sketches (real torch tensors) and the
divergence curve drawn from them, the one full copy a run keeps, and `check` refusing to start
where the disk cannot hold its runs (a real tmpfs)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchrepro.analysis.nondeterminism import curve_estimate_note
from torchrepro.analysis.divergence import (
    divergence_curve,
    final_within,
    load_snapshot,
    load_sketch,
    param_difference,
    sketch_difference,
    sketch_error,
    snapshot_steps,
    Tolerance,
)
from torchrepro.capture.snapshots import SKETCH_BYTES, SnapshotWriter, count_sketch, mix, sketch_dims, tensor_seed
from torchrepro.eventlog.event_reader import EventLog, read_events
from torchrepro.eventlog.events import Capability, Params

SCRIPTS = Path(__file__).parents[1] / "scripts"
MASK = (1 << 64) - 1


def splitmix64(i: int, seed: int) -> int:
    """SplitMix64's finaliser of ``i + seed`` in Python integers (the reference)."""
    z = (i + seed) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_the_hash_is_splitmix64_in_wrapping_int64():
    seed = tensor_seed("blocks.0.qkv.weight")
    indices = [0, 1, 2, 12345, 2**40 + 7, 2**62, 2**63 - 1 - seed]
    got = [v & MASK for v in mix(torch.tensor(indices), seed).tolist()]
    assert got == [splitmix64(i, seed) for i in indices]
    assert tensor_seed("a") != tensor_seed("b") and tensor_seed("a") == tensor_seed("a")


def _differences(n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    dense = torch.randn(n, generator=g, dtype=torch.float64)
    block = torch.zeros(n, dtype=torch.float64)
    block[1000:3000] = 1e-6  # a contiguous run of equal differences (one row of a matrix)
    strided = torch.zeros(n, dtype=torch.float64)
    strided[::97] = torch.randn(strided[::97].shape, generator=g, dtype=torch.float64)
    single = torch.zeros(n, dtype=torch.float64)
    single[n // 2] = 3.0
    spiky = dense.clone()
    spiky[:10] *= 1000  # a few large entries among many small
    return {"dense": dense, "block": block, "strided": strided, "single": single, "spiky": spiky}


@pytest.mark.parametrize("kind", ["dense", "block", "strided", "single", "spiky"])
def test_a_sketch_difference_estimates_the_l2_difference_within_the_stated_bound(kind):
    n, k = 200_000, 1024
    base = torch.randn(n, generator=torch.Generator().manual_seed(0))
    d = _differences(n)[kind].float()
    other = base + d
    seed = tensor_seed(f"param.{kind}")
    estimate = float(np.linalg.norm(count_sketch(other, k, seed) - count_sketch(base, k, seed)))
    exact = float(torch.linalg.vector_norm((other.double() - base.double())))
    assert abs(estimate - exact) <= sketch_error(k) * exact, (estimate, exact)


def test_equal_tensors_give_equal_sketches_and_small_ones_are_kept_whole():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    a, b = count_sketch(x, 64, 7), count_sketch(x.clone(), 64, 7)
    assert a.tobytes() == b.tobytes() and a.shape == (64,) and a.dtype == np.float64
    small = torch.randn(3, 5, dtype=torch.bfloat16)
    assert np.array_equal(count_sketch(small, 64, 7), small.double().reshape(-1).numpy())
    # linear: the sketch of a sum is the sum of the sketches (float64, up to rounding)
    y = torch.randn(5000, generator=torch.Generator().manual_seed(3))
    assert np.allclose(count_sketch(x + y, 64, 7), count_sketch(x, 64, 7) + count_sketch(y, 64, 7), atol=1e-5)


GPT2_SMALL = (
    [("wte", 50257 * 768), ("wpe", 1024 * 768)]
    + [
        (f"h.{i}.{name}", size)
        for i in range(12)
        for name, size in [
            ("ln_1.weight", 768),
            ("ln_1.bias", 768),
            ("attn.c_attn.weight", 768 * 2304),
            ("attn.c_attn.bias", 2304),
            ("attn.c_proj.weight", 768 * 768),
            ("attn.c_proj.bias", 768),
            ("ln_2.weight", 768),
            ("ln_2.bias", 768),
            ("mlp.c_fc.weight", 768 * 3072),
            ("mlp.c_fc.bias", 3072),
            ("mlp.c_proj.weight", 3072 * 768),
            ("mlp.c_proj.bias", 768),
        ]
    ]
    + [("ln_f.weight", 768), ("ln_f.bias", 768)]
)


def test_sketch_dims_at_gpt2_small_fit_one_megabyte_and_bound_the_error():
    names, sizes = [n for n, _ in GPT2_SMALL], [s for _, s in GPT2_SMALL]
    assert sum(sizes) == 124_439_808
    k = sketch_dims(names, sizes)
    values = 8 * sum(min(n, k) for n in sizes)
    assert values + len(names) * (4 * max(map(len, names)) + 4 * 16 + 4 * 8) <= SKETCH_BYTES
    assert k >= 512 and sketch_error(k) < 0.25
    assert sketch_dims(names[:3], [10, 20, 30]) == 30  # all fits: every tensor kept whole


def _model_params(seed: int) -> tuple[list[str], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = {"emb.weight": (4000, 64), "fc.weight": (256, 64), "fc.bias": (256,), "ln.weight": (64,)}
    return list(shapes), [torch.randn(s, generator=g) for s in shapes.values()]


def _write_run(folder: Path, steps: int, perturb_from: int | None, tiny: bool = False) -> None:
    """A run's snapshots: parameters changing by the same update each step, perturbed (from
    ``perturb_from`` on) by small differences in one large and one small tensor (or in the
    small tensor only: ``tiny``). Never more than two full copies on disk."""
    names, params = _model_params(0)
    writer = SnapshotWriter(folder)
    for step in range(steps):
        assert len(snapshot_steps(folder) if folder.exists() else []) <= 2
        for i, p in enumerate(params):
            p.add_(0.01 * (i + 1))
        if perturb_from is not None and step >= perturb_from:
            if not tiny:
                params[0][step, :8] += 1e-3 * (step + 1)
            params[2][step] += 5e-4
        assert writer.write(step, names, [p.clone() for p in params]) is None
        if perturb_from is not None and step >= perturb_from:
            if not tiny:
                params[0][step, :8] -= 1e-3 * (step + 1)
            params[2][step] -= 5e-4


def test_a_run_keeps_the_first_and_last_full_copies_and_a_sketch_per_step(tmp_path):
    _write_run(tmp_path / "a", 6, None)
    assert sorted(snapshot_steps(tmp_path / "a")) == [0, 5]  # the first and last steps' parameters, whole
    assert sorted(snapshot_steps(tmp_path / "a", "sketch")) == list(range(6))
    names, params = _model_params(0)
    full = load_snapshot(tmp_path / "a" / "step-0000005.npz", _log(tmp_path / "a"))
    copy = sum(p.numel() * 4 for p in params)
    assert set(full) == set(names) and sum(a.nbytes for a in full.values()) == copy
    sketch = load_sketch(tmp_path / "a" / "sketch-0000005.npz", _log(tmp_path / "a"))
    assert sketch.names == names and sketch.numel == [p.numel() for p in params]
    assert max(sketch.dims) < params[0].numel() and sketch.dims[3] == 64  # the small tensor whole
    assert sketch.max_abs[3] == pytest.approx(float(full["ln.weight"].__abs__().max()))
    assert sketch.l2[1] == pytest.approx(float(np.linalg.norm(full["fc.weight"].astype(np.float64))))
    assert all(p.stat().st_size <= SKETCH_BYTES for p in (tmp_path / "a").glob("sketch-*.npz"))


def _log(path: Path) -> EventLog:
    """The event log of a run whose snapshots ``_write_run`` wrote: the parameters it names (the
    shapes and dtypes a sketch's whole values are checked with), no step fingerprinted."""
    names, params = _model_params(0)
    shapes, dtypes = [list(p.shape) for p in params], ["float32"] * len(params)
    return EventLog(path, events=[Params(names=names, shapes=shapes, dtypes=dtypes, kinds=["tensor"] * len(params))])


def test_the_curve_is_exact_where_kept_and_estimated_elsewhere(tmp_path):
    _write_run(tmp_path / "a", 5, None)
    _write_run(tmp_path / "b", 5, 2)
    curve = divergence_curve(tmp_path / "a", tmp_path / "b", _log(tmp_path / "a"), _log(tmp_path / "b"))
    assert [p["step"] for p in curve] == [0, 1, 2, 3, 4]
    assert sorted(snapshot_steps(tmp_path / "b")) == [0, 4]
    for p in curve[:2]:  # equal fingerprints: no difference, exactly
        assert (p["max_abs"], p["max_rel"], p["l2"], p["estimated"]) == (0.0, 0.0, 0.0, False)
    for p in curve[2:4]:  # a sketched tensor differs: max-abs unknown, L2 estimated
        step = p["step"]
        exact = math.sqrt(8 * (1e-3 * (step + 1)) ** 2 + (5e-4) ** 2)
        assert p["max_abs"] is None and p["max_rel"] is None and p["estimated"] and p["sketch_dims"]
        assert abs(p["l2"] - exact) <= sketch_error(p["sketch_dims"]) * exact
        assert p["parameter"] == "emb.weight"
    last = curve[-1]  # both kept the last step whole: exact, as from full snapshots
    assert not last["estimated"] and last["max_abs"] == pytest.approx(1e-3 * 5, rel=1e-3)
    full = param_difference(
        load_snapshot(tmp_path / "a" / "step-0000004.npz", _log(tmp_path / "a")),
        load_snapshot(tmp_path / "b" / "step-0000004.npz", _log(tmp_path / "b")),
    )
    assert full == {k: last[k] for k in full}
    note = curve_estimate_note(curve)
    assert note is not None and "step(s) 2, 3:" in note
    assert (
        f"{curve[2]['sketch_dims']}-dim projection" in note
        and f"<= {sketch_error(curve[2]['sketch_dims']):.2f}" in note
    )
    assert curve_estimate_note(curve[:2] + curve[4:]) is None


def test_differences_only_in_tensors_kept_whole_stay_exact(tmp_path):
    _write_run(tmp_path / "a", 3, None)
    _write_run(tmp_path / "b", 3, 1, tiny=True)
    point = sketch_difference(
        load_sketch(tmp_path / "a" / "sketch-0000001.npz", _log(tmp_path / "a")),
        load_sketch(tmp_path / "b" / "sketch-0000001.npz", _log(tmp_path / "b")),
    )
    assert not point["estimated"] and point["parameter"] == "fc.bias"
    assert point["max_abs"] == pytest.approx(5e-4, rel=1e-3) and point["l2"] == pytest.approx(5e-4, rel=1e-3)


def test_final_within_reads_the_kept_copy_or_exact_sketches(tmp_path):
    _write_run(tmp_path / "a", 3, None)
    _write_run(tmp_path / "b", 3, 0, tiny=True)
    assert final_within(
        Tolerance(atol=1e-3), tmp_path / "a", tmp_path / "b", _log(tmp_path / "a"), _log(tmp_path / "b")
    )
    assert not final_within(
        Tolerance(atol=1e-5), tmp_path / "a", tmp_path / "b", _log(tmp_path / "a"), _log(tmp_path / "b")
    )
    (tmp_path / "b" / "step-0000002.npz").unlink()  # only sketches in common: the small tensor whole
    assert final_within(
        Tolerance(atol=1e-3), tmp_path / "a", tmp_path / "b", _log(tmp_path / "a"), _log(tmp_path / "b")
    )
    _write_run(tmp_path / "c", 3, 0)
    (tmp_path / "c" / "step-0000002.npz").unlink()  # a sketched tensor differs: not known to be within
    assert not final_within(
        Tolerance(atol=1.0), tmp_path / "a", tmp_path / "c", _log(tmp_path / "a"), _log(tmp_path / "c")
    )


def torchrepro(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=dict(os.environ),
        timeout=600,
    )


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (skipped where it cannot be mounted: not root, no mount privilege)."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_run_whose_disk_cannot_hold_a_full_copy_keeps_the_sketch_and_says_so(small_disk):
    writer = SnapshotWriter(small_disk / "snapshots")
    small = [torch.ones(1000)]
    assert writer.write(0, ["w"], small) is None  # fits: whole
    big = [torch.ones(2_000_000)]  # 8 MB of float32 on a 4 MiB disk
    note = writer.write(1, ["w"], big)
    assert note is not None and note.startswith("step 1's parameters not kept whole: ")
    assert sorted(snapshot_steps(small_disk / "snapshots")) == [0]  # the copy kept before stays
    assert sorted(snapshot_steps(small_disk / "snapshots", "sketch")) == [0, 1]


def test_run_snapshots_on_a_small_disk_record_that_the_full_copy_was_not_kept(small_disk, tmp_path):
    script = tmp_path / "wide.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(1000, 2000)  # 8 MB of parameters\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(2):\n    model(torch.ones(4, 1000)).sum().backward(); opt.step(); opt.zero_grad()\n"
    )
    proc = torchrepro("run", "--snapshots", "--out", str(small_disk / "run"), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    log = read_events(small_disk / "run" / "rank-0" / "events.jsonl")
    notes = [c.note for c in log.of(Capability) if c.name == "snapshots"]
    assert len(notes) == 1 and "not kept whole" in notes[0]
    snaps = small_disk / "run" / "rank-0" / "snapshots"
    assert sorted(snapshot_steps(snaps, "sketch")) == [0, 1] and not snapshot_steps(snaps)


def test_check_refuses_to_start_where_the_disk_cannot_hold_its_runs(small_disk, tmp_path):
    proc = torchrepro(
        "check",
        "--against",
        "eager",
        "--out",
        str(small_disk / "check"),
        str(SCRIPTS / "deterministic.py"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchrepro: error: not enough disk for the check: ")
    assert "268.4 MB needed" in lines[0] and "--disk-budget" in lines[0]
    assert not (small_disk / "check").exists()  # nothing started, nothing written
    proc = torchrepro(
        "check",
        "--disk-budget",
        "5M",
        "--out",
        str(small_disk / "check"),
        str(SCRIPTS / "deterministic.py"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "(--disk-budget)" in proc.stderr, proc.stderr


def test_check_starts_within_its_disk_budget_and_keeps_full_copies_only_as_evidence(small_disk, tmp_path):
    """The normal path on the small disk: a budget that fits, a real check with snapshots (--rtol)."""
    out = small_disk / "check"
    proc = torchrepro(
        "check",
        "--disk-budget",
        "1M",
        "--rtol",
        "1e-6",
        "--no-fixes",
        "--out",
        str(out),
        str(SCRIPTS / "deterministic.py"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    verdict = report["determinism"]["verdict"]
    assert verdict in ("bit_exact", "within_tolerance")
    for run in ("run-1", "run-2"):  # bit-exact runs: no full copy is evidence of anything
        snaps = out / run / "rank-0" / "snapshots"
        assert len(list(snaps.glob("step-*.npz"))) == (verdict != "bit_exact") and list(snaps.glob("sketch-*.npz"))


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_a_check_keeps_full_copies_only_of_the_pair_that_diverged(tmp_path):
    """Three runs that differ (a clock-seeded nudge), held to a tolerance they exceed: once the check
    has decided, the first pair that diverged keeps its last step whole, the third run its sketches."""
    out = tmp_path / "check"
    proc = torchrepro(
        "check", "--runs", "3", "--rtol", "1e-12", "--no-fixes", "--no-localize", "--out", str(out),
        str(SCRIPTS / "tiny_noise.py"), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    det = json.loads((out / "report.json").read_text())["determinism"]
    assert det["verdict"] == "diverged" and det["curve"][-1]["max_abs"] > 0
    full = sorted(p.relative_to(out).parts[::3] for p in out.glob("*/rank-*/snapshots/step-*.npz"))
    # one copy each: the first divergent step where the runs kept it whole (the first and last), else the last
    step = det["first_divergence"]["step"] if det["first_divergence"]["step"] in (0, 3) else 3
    assert full == [("run-1", f"step-{step:07d}.npz"), ("run-2", f"step-{step:07d}.npz")]
    assert all(len(list((out / r / "rank-0" / "snapshots").glob("sketch-*.npz"))) == 4 for r in det["runs"])
    # the run left with sketches only still compares (this model's tensors are small enough to be kept whole in them)
    diff = torchrepro("diff", "--json", str(tmp_path / "d.json"), str(out / "run-1"), str(out / "run-3"), cwd=tmp_path)
    assert diff.returncode == 1, diff.stderr
    curve = json.loads((tmp_path / "d.json").read_text())["determinism"]["curve"]
    assert [p["step"] for p in curve] == [0, 1, 2, 3] and curve[-1]["max_abs"] > 0 and not curve[-1]["estimated"]


@pytest.mark.inductor
@pytest.mark.slow  # three runs of an ~8M-parameter GPT, two of them compiled
def test_check_against_eager_on_a_gpt_keeps_the_run_directory_bounded_by_the_model(tmp_path):
    out = tmp_path / "check"
    proc = torchrepro(
        "check",
        "--against",
        "eager",
        "--no-fixes",
        "--out",
        str(out),
        str(SCRIPTS / "gpt_sized.py"),
        "3",
        "10m",
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr  # compiled numerics differ from eager
    final = next((out / "eager" / "rank-0" / "snapshots").glob("step-*.npz"))
    copy = sum(a.nbytes for a in load_snapshot(final, read_events(out / "eager" / "rank-0" / "events.jsonl")).values())
    assert copy == 4 * 8_428_032  # one float32 copy of the model's parameters
    runs = [p for p in out.iterdir() if (p / "rank-0" / "snapshots").is_dir()]
    assert sorted(p.name for p in runs) == ["compiled", "eager", "fallback-random"]
    for run in runs:  # the pair that differs keeps the first divergent step whole; the third run its sketches only
        snaps = run / "rank-0" / "snapshots"
        assert len(list(snaps.glob("sketch-*.npz"))) == 3
        kept = [p.name for p in snaps.glob("step-*.npz")]
        assert kept == ([] if run.name == "fallback-random" else ["step-0000000.npz"])
    # the compiled graphs saved for torchrepro repro: the compared pair's only (at most 256 MiB a graph)
    assert sorted(p.parts[-3] for p in out.glob("*/rank-0/graphs")) == ["compiled"]
    # the whole check directory but those graphs: two parameter copies, a sketch a step a run, the logs
    whole = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and "graphs" not in p.parts)
    assert whole <= 2 * copy + len(runs) * 3 * 1_000_000 + 4_000_000, whole
    det = json.loads((out / "report.json").read_text())["determinism"]
    curve = det["curve"]
    assert [p["step"] for p in curve] == [0, 1, 2] and det["first_divergence"]["step"] == 0
    # the first and last steps, kept whole by both while the check decided: exact; the step between estimated
    assert [(p["estimated"], p["max_abs"] is None) for p in curve] == [(False, False), (True, True), (False, False)]
    assert all(p["l2"] > 0 for p in curve) and curve[0]["max_abs"] > 0
    assert det["decomposition"]["total"]["final_max_abs"] == curve[-1]["max_abs"]
    assert any("estimated from a" in note for note in det["notes"])
    # the runs still compare: exact at the first divergent step, which both keep whole, estimated where one did not
    for other, exact in (("compiled", True), ("fallback-random", False)):
        diff = torchrepro(
            "diff", "--json", str(tmp_path / f"{other}.json"), str(out / "eager"), str(out / other), cwd=tmp_path
        )
        assert diff.returncode == 1, diff.stderr
        first = json.loads((tmp_path / f"{other}.json").read_text())["determinism"]["curve"][0]
        assert (first["max_abs"] is not None, first["estimated"]) == (exact, not exact) and first["l2"] > 0


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_the_fingerprints_a_snapshot_is_checked_with_are_torchs_own(dtype):
    """What a snapshot holds (``capture.snapshots``: bfloat16 widened to float32, complex as real
    pairs), fingerprinted with numpy alone (``eventlog.snapshot_files``), gives the fingerprints
    torchrepro.digests gave the tensor in the run: on the CPU, on a device (its two sums, here
    computed on the CPU: integer sums do not depend on where), and a sketch's (the real pairs)."""
    import xxhash

    from torchrepro.capture.snapshots import _local, _to_numpy
    from torchrepro.digests import _device_digest, fingerprint
    from torchrepro.eventlog.snapshot_files import candidate_dtypes, fingerprints, matches

    g = torch.Generator().manual_seed(0)
    for shape in [(3, 5), (1000, 33), (7,), (), (0, 3)]:
        t = (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dtype)
        held = _to_numpy(_local(t))
        recorded = str(dtype).removeprefix("torch.")
        got = set(fingerprints(held, candidate_dtypes(held, recorded)))
        cpu, device = fingerprint(t)[:16], xxhash.xxh3_128_hexdigest(b"t" + _device_digest(t))[:16]
        assert {cpu, device, fingerprint(_local(t))[:16]} <= got, (dtype, shape)
        assert matches(held, [cpu, fingerprint(_local(t))[:16]], candidate_dtypes(held, recorded))
        if held.size and not (held == 0).all():
            assert not matches(np.zeros_like(held), [cpu], candidate_dtypes(held, recorded)), (dtype, shape)
