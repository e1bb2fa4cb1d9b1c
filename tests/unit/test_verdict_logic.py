"""The verdict logic on hand-built event logs (no training): every way a run can end, and what
may then be claimed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchrepro.analysis.verdict import Ending, compare_lengths, describe_exit, ending, judge, verdict_line
from torchrepro.eventlog.event_reader import EventLog
from torchrepro.eventlog.events import Capability, End, Header, Step


def log(rank: int = 0, steps: int = 3, end: End | None = End(), world: int = 1, **header) -> EventLog:
    events = [Header(rank=rank, world_size=world, **header), *(Step(rank=rank, index=i) for i in range(steps))]
    return EventLog(Path(f"rank-{rank}/events.jsonl"), events + ([end] if end else []))


def test_a_normal_run_ends_normally():
    e = ending("a", {"exit_code": 0}, [log()])
    assert e.ok and e.steps == {0: 3}


@pytest.mark.parametrize(
    "logs, meta, says",
    [
        ([log(end=None)], {}, "no end record"),
        ([log(end=End(exit_code=1, status="error", error="RuntimeError: boom"))], {}, "RuntimeError: boom"),
        ([log(end=End(exit_code=-15, status="terminated"))], {}, "killed by SIGTERM"),
        ([log()], {"exit_code": -9}, "killed by SIGKILL"),
        ([log()], {"stall": {"after_s": 3.0}}, "--timeout"),
        ([log(world=2)], {}, "rank(s) 1 of 2 wrote no event log"),
    ],
)
def test_runs_that_did_not_end_normally(logs, meta, says):
    e = ending("a", meta, logs)
    assert not e.ok and any(says in p for p in e.problems), e.problems
    verdict, code = judge(False, False, 3, [e, ending("b", {}, [log()])])
    assert (verdict, code) == ("incomplete", 3)


def test_damaged_and_foreign_logs():
    damaged = log()
    damaged.bad_lines = 2
    assert "2 damaged line(s)" in ending("a", {}, [damaged]).problems[0]
    foreign = log()
    foreign.unreadable = "schema 'x' written by torchrepro 9; this is torchrepro 0.1.0"
    e = ending("a", {}, [foreign])
    assert e.unreadable and not e.steps
    assert judge(False, False, 0, [e], unreadable_exit=2) == ("nothing_compared", 2)
    assert judge(False, False, 0, [e], unreadable_exit=3) == ("nothing_compared", 3)


def test_a_problem_in_the_log_is_damage_but_an_older_unchecked_step_log_is_not():
    from torchrepro.eventlog.stepstream import UNCHECKED

    old = log()
    old.problems.append(f"rank-0/steps.bin: {UNCHECKED}")
    assert ending("a", {}, [old]).ok
    damaged = log()
    damaged.problems.append("rank-0/steps.bin: byte 12: a record where a keyframe must be")
    e = ending("a", {}, [damaged])
    assert not e.ok and "byte 12" in e.problems[0]


def test_capture_that_stopped_is_not_a_complete_record():
    stopped = log()
    stopped.events.insert(2, Capability(name="capture_error", step=1, available=False, note="step capture stopped"))
    assert any("later steps not recorded" in p for p in ending("a", {}, [stopped]).problems)


def test_shorter_twin_is_named():
    a, b = Ending("run-1", steps={0: 6}), Ending("run-2", steps={0: 3})
    compare_lengths(a, b)
    assert a.ok and b.problems == ["rank 0: recorded 3 step(s), run-1 recorded 6"]


def test_judge():
    ok = [Ending("a"), Ending("b")]
    assert judge(False, False, 5, ok) == ("bit_exact", 0)
    assert judge(False, True, 5, ok) == ("within_tolerance", 0)
    assert judge(True, False, 5, ok) == ("diverged", 1)
    assert judge(False, False, 0, ok) == ("nothing_compared", 1)
    failed = [Ending("a", ["rank 0: no end record"]), Ending("b")]
    assert judge(True, False, 5, failed) == ("diverged", 3)
    assert describe_exit(1) == "exit code 1"


def test_verdict_lines_say_only_what_was_shown():
    from torchrepro.reports.check_report import Determinism, FirstDivergence, RunEnding
    from torchrepro.reports.findings import Verdict

    endings = [RunEnding("a", True), RunEnding("b", False, ["rank 0: no end record"])]

    def line(verdict: str, **changes: Any) -> str:
        return verdict_line(Determinism(Verdict(verdict), ["a", "b"], 4, endings, atol=1e-3, **changes))

    assert line("incomplete").startswith("INCOMPLETE")
    assert "b: rank 0: no end record" in line("incomplete")
    within = line("within_tolerance", more={"largest_difference": {"params_max_abs": 2e-7, "loss_max_abs": None}})
    assert within.startswith("WITHIN TOLERANCE") and "2e-07" in within and "not bit for bit" in within
    fd = FirstDivergence(0, 0, "init_params", "init_params")
    assert line("diverged", first_divergence=fd).startswith("DIVERGED before step 0")


def test_hint_never_repeats_a_fix_already_in_force():
    from torchrepro.analysis.nondeterminism import CAUSE_HINTS, hint_key
    from torchrepro.eventlog.events import Setting

    on = log()
    on.events.insert(1, Setting(name="deterministic_algorithms", value=True))
    assert hint_key("nondeterministic_op", None, [on]) == "nondeterministic_op_deterministic_on"
    assert (
        "use_deterministic_algorithms" not in CAUSE_HINTS["nondeterministic_op_deterministic_on"].split("although")[0]
    )
    assert hint_key("nondeterministic_op", None, [log()]) == "nondeterministic_op"
    assert hint_key("rng", "eager", [log()]) == "rng_compiled"
