"""Cross-rank findings from event logs (pure analysis: the logs are built here, as a copied-together
run directory would hold them)."""

from __future__ import annotations

from array import array
from pathlib import Path

from torchrepro.analysis.doctor import analyse
from torchrepro.analysis.kept_steps import kept_steps
from torchrepro.analysis.ranks import missing_ranks, placement, rank_findings, where, world_size
from torchrepro.eventlog.event_reader import EventLog
from torchrepro.eventlog.events import CacheLookup, Compile, End, Header, Params, Step, World


def log(rank: int, events: list) -> EventLog:
    for e in events:
        e.rank = rank
    return EventLog(Path(f"run/rank-{rank}/events.jsonl"), [Header(rank=rank, world_size=2), *events])


def steps(
    n: int, *, params=lambda i, r: f"p{i}", rng=lambda i, r: f"r{i}", batch=lambda i, r: f"b{i}-{r}", rank: int = 0
) -> list:
    return [
        Step(
            step=i,
            index=i,
            params_fp=params(i, rank),
            param_fps=[params(i, rank), "same"],
            rng_fps={"torch_cpu": rng(i, rank)},
            batch_fp=batch(i, rank),
        )
        for i in range(n)
    ]


PARAMS = Params(
    names=["layer.weight", "layer.bias"], shapes=[[2, 2], [2]], dtypes=["float32"] * 2, kinds=["tensor"] * 2
)


def codes(logs) -> dict[str, dict]:
    return {f.code: f.evidence for f in rank_findings(logs, kept_steps(logs))}


def test_replicas_in_step_with_per_rank_rng_give_no_finding():
    logs = [log(r, [PARAMS, *steps(4, rng=lambda i, r: f"r{i}-{r}", rank=r)]) for r in (0, 1)]
    assert codes(logs) == {}


def test_replicas_diverging_mid_run_name_the_step_and_parameter():
    diverge = lambda i, r: f"p{i}" if i < 3 or r == 0 else f"x{i}"  # noqa: E731
    logs = [log(r, [PARAMS, *steps(5, params=diverge, rng=lambda i, r: f"r{i}-{r}", rank=r)]) for r in (0, 1)]
    evidence = codes(logs)["REPLICAS_DIVERGE"]
    assert evidence["step"] == 3 and evidence["ranks"] == [0, 1] and evidence["parameters"] == ["layer.weight"]


def test_same_rng_on_different_data_and_duplicate_batches():
    same_rng = [log(r, [PARAMS, *steps(4, rank=r)]) for r in (0, 1)]
    assert "RNG_IDENTICAL_ACROSS_RANKS" in codes(same_rng)
    unused_rng = [log(r, [PARAMS, *steps(4, rng=lambda i, r: "r", rank=r)]) for r in (0, 1)]
    assert "RNG_IDENTICAL_ACROSS_RANKS" not in codes(unused_rng)  # the stream never advances: no random op
    duplicated = [
        log(r, [PARAMS, *steps(4, rng=lambda i, r: f"r{i}-{r}", batch=lambda i, r: f"b{i}", rank=r)]) for r in (0, 1)
    ]
    assert "DUPLICATE_BATCHES_ACROSS_RANKS" in codes(duplicated)


def test_batch_fingerprints_compare_as_written_however_they_are_held():
    """Capture's fingerprints (16 lowercase hex digits) are held as 8 bytes each, anything else as
    written: the findings are the same, and two spellings of one number stay two fingerprints."""
    own = lambda i, r: f"{i + 0xABC:08x}{r:08x}"  # each rank its own batches
    shared = lambda i, r: f"{i + 0xABC:016x}"  # every rank the same batches
    split = [log(r, [PARAMS, *steps(4, batch=own, rank=r)]) for r in (0, 1)]
    assert isinstance(kept_steps(split)[0].batch_fps, array)
    assert "RNG_IDENTICAL_ACROSS_RANKS" in codes(split)
    per_rank_rng = lambda i, r: f"r{i}-{r}"
    duplicated = [log(r, [PARAMS, *steps(4, rng=per_rank_rng, batch=shared, rank=r)]) for r in (0, 1)]
    assert "DUPLICATE_BATCHES_ACROSS_RANKS" in codes(duplicated)
    # rank 1 writes step 3's fingerprint in capitals: held as written, its other steps as rank 0's
    shouted = lambda i, r: shared(i, r).upper() if (i, r) == (3, 1) else shared(i, r)
    partly = [log(r, [PARAMS, *steps(4, batch=shouted, rank=r)]) for r in (0, 1)]
    kept = kept_steps(partly)
    assert isinstance(kept[0].batch_fps, array) and isinstance(kept[1].batch_fps, list)
    assert list(kept[0].batch_fps[:3]) == kept[1].batch_fps[:3] and kept[0].batch_fps[3] != kept[1].batch_fps[3]
    # steps 0-2 are the same batch on both ranks: neither "different data" nor "identical batches"
    assert not {"RNG_IDENTICAL_ACROSS_RANKS", "DUPLICATE_BATCHES_ACROSS_RANKS"} & set(codes(partly))
    written = [log(r, [PARAMS, *steps(4, batch=lambda i, r: f"{i + 0xABC:016X}", rank=r)]) for r in (0, 1)]
    assert "DUPLICATE_BATCHES_ACROSS_RANKS" in codes(written)  # not capture's spelling, equal all the same


def test_torch_rng_digests_compare_as_written_however_they_are_held():
    """Torch RNG digests are held as batch fingerprints are: capture's as 8 bytes each; a value that
    is no string (a number a log held there) is never the number a digest's bytes make."""
    own = lambda i, r: f"{i + 0xABC:08x}{r:08x}"  # each rank its own batches
    rng = lambda i, r: f"{i + 1:016x}"
    same = [log(r, [PARAMS, *steps(4, rng=rng, batch=own, rank=r)]) for r in (0, 1)]
    assert isinstance(kept_steps(same)[0].torch_streams, array)
    assert "RNG_IDENTICAL_ACROSS_RANKS" in codes(same)
    numbers = [
        log(r, [PARAMS, *steps(4, rng=rng if r == 0 else lambda i, r: i + 1, batch=own, rank=r)]) for r in (0, 1)
    ]
    assert kept_steps(numbers)[1].torch_streams == [(1,), (2,), (3,), (4,)]
    assert "RNG_IDENTICAL_ACROSS_RANKS" not in codes(numbers)


def test_cache_split_and_compile_straggler():
    first = Compile(step=0, compile_id="0/0", function="forward", dynamo_s=1.0)
    logs = [
        log(0, [first, CacheLookup(step=0, cache="fxgraph", status="hit"), *steps(4, rank=0)]),
        log(
            1,
            [
                Compile(step=0, compile_id="0/0", function="forward", dynamo_s=3.5),
                CacheLookup(step=0, cache="fxgraph", status="miss"),
                *steps(4, rank=1),
            ],
        ),
    ]
    found = codes(logs)
    assert found["CACHE_DECISION_SPLIT"]["per_rank"] == {0: {"hit": 1, "miss": 0}, 1: {"hit": 0, "miss": 1}}
    assert found["COMPILE_STRAGGLER"] == {"rank": 1, "step": 0, "extra_compile_s": 2.5}


def test_where_a_hung_rank_waits():
    frames = [
        {"file": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 3, "function": "all_reduce"},
        {"file": "/home/me/train.py", "line": 42, "function": "main"},
    ]
    assert (
        where(frames) == "/home/me/train.py:42 in main, waiting in all_reduce ("
        "/x/site-packages/torch/distributed/distributed_c10d.py:3)"
    )
    assert where([]) is None


def test_the_world_the_process_group_reports_decides_which_ranks_are_missing():
    """A launcher started rank 0 alone (header: world 1); its process group has 4 ranks; two logs arrived."""
    alone = EventLog(
        Path("run/rank-0/events.jsonl"),
        [
            Header(rank=0, world_size=1, host="a"),
            World(rank=0, group_rank=0, world_size=4, host="a"),
            Step(index=0),
            End(),
        ],
    )
    other = EventLog(
        Path("run/rank-2/events.jsonl"),
        [
            Header(rank=2, world_size=4, host="b"),
            World(rank=2, group_rank=2, world_size=4, local_rank=0, node=1, host="b"),
            Step(rank=2, index=0),
            End(rank=2),
        ],
    )
    assert world_size([alone]) == 4 and missing_ranks([alone, other]) == [1, 3]
    assert missing_ranks([alone], {"world_size": 1}) == [1, 2, 3]
    assert placement([alone, other]) == {
        0: {"host": "a", "node": 0, "local_rank": 0},
        2: {"host": "b", "node": 1, "local_rank": 0},
    }
    report = analyse({}, [alone, other], [])
    missing = next(f for f in report.findings if f.code == "RANKS_MISSING")
    assert missing.severity == "error" and missing.evidence["missing"] == [1, 3]
    assert report.failing_findings == ["RANKS_MISSING"] and report.verdict_line.startswith("PROBLEMS")
    assert report.run.world_size == 4 and report.run.ranks_missing == [1, 3] and report.exit_code == 1


def test_every_rank_present_is_not_missing_and_a_launcher_world_counts_too():
    logs = [
        EventLog(Path(f"run/rank-{r}/events.jsonl"), [Header(rank=r, world_size=2), Step(rank=r, index=0), End(rank=r)])
        for r in (0, 1)
    ]
    assert missing_ranks(logs) == [] and analyse({}, logs, []).verdict_line.startswith("HEALTHY")
    assert missing_ranks(logs, {"world_size": 3}) == [2]  # torchrun --nproc 3, one rank never wrote


def test_a_launcher_that_only_started_the_ranks_is_judged_by_how_it_ended():
    logs = [
        EventLog(Path(f"run/rank-{r}/events.jsonl"), [Header(rank=r, world_size=2), Step(rank=r, index=0), End(rank=r)])
        for r in (0, 1)
    ]
    crashed = {"launcher": {"exit_code": 1, "status": "error", "error": "RuntimeError: evaluation failed"}}
    report = analyse(crashed, logs, [])
    assert report.run.failed and "SCRIPT_FAILED" in [f.code for f in report.findings]
    teardown = {
        "launcher": {
            "exit_code": 1,
            "status": "error",
            "error": "ChildFailedError: ... rank : 0 (local_rank: 0)\n  exitcode  : -6 (pid: 8256)  (SIGABRT)",
        }
    }
    report = analyse(teardown, logs, [])
    assert not report.run.failed
    assert [(f.code, f.severity) for f in report.findings] == [("RANK_ABORTED_AFTER_COMPLETION", "warning")]


def test_the_lowest_diverging_rank_is_named_and_a_missing_batch_fingerprint_proves_nothing():
    diverge = lambda i, r: f"p{i}" if i < 2 or r == 0 else f"x{i}-{r}"  # noqa: E731
    logs = [log(r, [PARAMS, *steps(4, params=diverge, rank=r)]) for r in (3, 0, 2)]
    evidence = codes(logs)["REPLICAS_DIVERGE"]
    assert evidence["step"] == 2 and evidence["ranks"] == [0, 2]
    shorter = log(4, [PARAMS, *steps(4, params=diverge, rank=4)[1:3]])  # steps 1 and 2 only
    evidence = codes([*logs, shorter])["REPLICAS_DIVERGE"]
    assert evidence["step"] == 2 and evidence["ranks"] == [0, 2]
    one_unknown = [
        log(r, [PARAMS, *steps(4, batch=lambda i, r: None if (i, r) == (3, 1) else f"b{i}", rank=r)]) for r in (0, 1)
    ]
    assert not {"RNG_IDENTICAL_ACROSS_RANKS", "DUPLICATE_BATCHES_ACROSS_RANKS"} & set(codes(one_unknown))
    shared_batch = [
        log(r, [PARAMS, *steps(4, batch=lambda i, r: "b" if i == 2 and r else f"b{i}-{r}", rank=r)]) for r in (0, 1, 2)
    ]
    assert "RNG_IDENTICAL_ACROSS_RANKS" not in codes(shared_batch)  # two ranks trained on one batch at step 2
