"""What a comparison of runs may claim, from what was compared and how every run ended.

A verdict is earned: ``bit_exact`` needs at least one compared step, no difference in any of
them, every run ended normally (exit 0, an end record on every rank the world had, an
undamaged log of this schema, as many steps as its twin), every step of both runs paired once
and in order, and every kind of evidence one run holds at a step held by the other too.
Anything less is ``incomplete`` (the compared steps agree, but a run did not end normally or
the comparison does not cover both runs), ``nothing_compared``,
``within_tolerance`` (differences, all within ``--rtol``/``--atol``) or ``diverged``. Pure:
run metadata and event logs in, verdict out; nothing here imports torch.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import TypedDict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import Capability, Step
from ..eventlog.payloads import JsonObject
from ..reports.check_report import Determinism
from ..reports.findings import Verdict, comparison_exit_code
from .ranks import missing_rank_ranges, missing_text, world_size


class EndingRecord(TypedDict):
    """An :class:`Ending` as a report's ``endings`` list holds it (read back as :class:`~torchrepro.reports.check_report.RunEnding`)."""

    run: str
    ended_normally: bool
    problems: list[str]
    unreadable: bool
    steps: dict[str, int]  # rank -> steps recorded


@dataclass
class Ending:
    """How one run ended: ``problems`` is empty when it ended normally; ``unreadable`` when one
    of its logs cannot be read at all (another schema, no header)."""

    label: str
    problems: list[str] = field(default_factory=list)
    unreadable: bool = False
    steps: dict[int, int] = field(default_factory=dict)  # rank -> steps recorded

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> EndingRecord:
        return {
            "run": self.label,
            "ended_normally": self.ok,
            "problems": self.problems,
            "unreadable": self.unreadable,
            "steps": {str(r): n for r, n in sorted(self.steps.items())},
        }


def describe_exit(code: int) -> str:
    """``-9`` → ``killed by SIGKILL``; ``1`` → ``exit code 1``.

    >>> describe_exit(-9)
    'killed by SIGKILL'
    """
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def ending(label: str, meta: JsonObject, logs: list[EventLog]) -> Ending:
    """How the run ``label`` ended, from its ``run.json`` (``meta``) and its rank logs."""
    out = Ending(label, steps={log.rank: len(log.of(Step)) for log in logs if not log.unreadable})
    for log in logs:
        if log.unreadable:
            out.problems.append(f"rank {log.rank}: {log.unreadable}")
            out.unreadable = True
            continue
        end = log.end
        if end is None:
            out.problems.append(f"rank {log.rank}: no end record (the process was killed, or the log is truncated)")
        elif end.status not in ("ok", "imported"):
            how = describe_exit(end.exit_code) if isinstance(end.exit_code, int) else end.status
            out.problems.append(f"rank {log.rank}: {end.status} ({how})" + (f": {end.error}" if end.error else ""))
        if log.bad_lines:
            out.problems.append(f"rank {log.rank}: {log.bad_lines} damaged line(s) in its event log")
        elif log.damage:
            out.problems.append(f"rank {log.rank}: its event log is damaged ({log.damage[0]})")
        stopped = next((c for c in log.of(Capability) if c.name == "capture_error"), None)
        if stopped is not None:
            out.problems.append(f"rank {log.rank}: {stopped.note} (at step {stopped.step}; later steps not recorded)")
    missing = missing_rank_ranges(logs, meta)
    if missing:
        out.problems.append(f"rank(s) {missing_text(missing[:20])} of {world_size(logs, meta)} wrote no event log")
    lost = meta.get("interrupted")  # set when the run directory is read (eventlog.rundir.supervisor_lost)
    if isinstance(lost, dict):
        out.problems.append(
            f"interrupted: torchrepro's supervisor (pid {lost.get('supervisor_pid')}) ended without recording "
            "the end of the job"
        )
    code = meta.get("exit_code")
    if isinstance(code, int) and code != 0:
        out.problems.append(f"the job ended with {describe_exit(code)}")
    stall = meta.get("stall") or ({"after_s": meta["stalled_after_s"]} if meta.get("stalled_after_s") else None)
    if stall:
        out.problems.append(f"stopped by --timeout after {stall.get('after_s')} s without progress")
    return out


def compare_lengths(a: Ending, b: Ending, diverged: bool = False) -> None:
    """A run that recorded fewer steps than its twin on a rank (or lacks a rank its twin has)
    did not end normally: say so on the shorter one. Not when the runs ``diverged`` and both ended
    normally: runs that part may run for different lengths (a loop until the loss is small), and
    the comparison's notes say how many steps each recorded."""
    if diverged and a.ok and b.ok:
        return
    for rank in sorted(set(a.steps) | set(b.steps)):
        na, nb = a.steps.get(rank), b.steps.get(rank)
        if na is None or nb is None:
            short, other = (a, b) if na is None else (b, a)
            if not short.unreadable:  # an unreadable log is said already
                short.problems.append(f"rank {rank}: no log, while {other.label} has one")
        elif na != nb:
            short, other, n, m = (a, b, na, nb) if na < nb else (b, a, nb, na)
            short.problems.append(f"rank {rank}: recorded {n} step(s), {other.label} recorded {m}")


def nothing_compared_because(endings: list[Ending]) -> str:
    """Why no step could be compared."""
    unreadable = [e.label for e in endings if e.unreadable]
    if unreadable:
        return f"the event log of {', '.join(unreadable)} cannot be read"
    empty = [e.label for e in endings if not any(e.steps.values())]
    if empty:
        return (
            f"{', '.join(empty)} recorded no training step (no optimizer.step() and no backward() was seen, "
            "or the script ended before its first step)"
        )
    return "the runs have no rank and step index in common"


def judge(
    diverged: bool,
    within_tolerance: bool,
    steps_compared: int,
    endings: list[Ending],
    unreadable_exit: int = 2,
    incomplete_because: list[str] | None = None,
) -> tuple[str, int]:
    """The verdict and the exit code: ``unreadable_exit`` when a log cannot be read (2 for
    stored runs given as input; 3 for runs a check launched), 3 when a run did not end
    normally or the comparison does not cover both runs (``incomplete_because``: steps not
    paired, evidence one run lacks; see :class:`~.divergence.Coverage`), 1 when the runs
    diverged or nothing was compared, else 0."""
    if diverged:
        verdict = "diverged"
    elif steps_compared == 0:
        verdict = "nothing_compared"
    elif any(not e.ok for e in endings) or incomplete_because:
        verdict = "incomplete"
    else:
        verdict = "within_tolerance" if within_tolerance else "bit_exact"
    return verdict, comparison_exit_code(
        Verdict(verdict), all(e.ok for e in endings), any(e.unreadable for e in endings), unreadable_exit
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def verdict_line(det: Determinism) -> str:
    """The one-line summary of a ``determinism`` section."""
    v, n = det.verdict.value, det.steps_compared
    failed = [e for e in det.endings if not e.ended_normally]
    how = "; ".join(f"{e.run}: {e.problems[0]}" for e in failed)
    if v == "bit_exact":
        return f"BIT-EXACT: {len(det.runs)} runs agree bit for bit over {n} step(s), and every run ended normally"
    if v == "within_tolerance":
        largest = det.more.get("largest_difference") or {}
        return (
            f"WITHIN TOLERANCE (rtol={det.rtol}, atol={det.atol}): the runs differ over {n} step(s), by at "
            f"most {_fmt(largest.get('params_max_abs'))} in parameters and {_fmt(largest.get('loss_max_abs'))} "
            "in loss — not bit for bit"
        )
    if v == "incomplete":
        gaps = det.more.get("incomplete_because") or []
        if not failed:
            return f"INCOMPLETE: the comparison ({n} step(s)) does not cover both runs — {gaps[0]}"
        return f"INCOMPLETE: the {n} step(s) both runs recorded agree, but not every run ended normally — {how}"
    fd = det.first_divergence
    if v == "nothing_compared" or fd is None:
        return f"NOTHING COMPARED: {det.more.get('nothing_compared_because', 'no common step')}" + (
            f" — {how}" if how else ""
        )
    ev = fd.evidence
    where = ", ".join(
        x
        for x in (
            f"module {ev.module}" if ev.module else None,
            f"op {ev.op}" if ev.op else None,
            f"at {ev.source}" if ev.source else None,
        )
        if x
    )
    if fd.cause == "shared_files":  # the file one run wrote and a later one read, named
        where = ev.because or ""
    at = "before step 0" if fd.what == "init_params" else f"at step {fd.step}"
    what = fd.what
    if what == "compiled_graph":  # the runs agreed; a graph called again on identical inputs did not
        at = f"when repeated {at}"
        what = f"compiled graph {fd.detail.get('compile_id')} ({fd.detail.get('graph')}) of {fd.detail.get('run')}"
    return (
        f"DIVERGED {at} (rank {fd.rank}, {what}): cause {fd.cause}"
        + (f" — {where}" if where else "")
        + (f" (and {how})" if how else "")
    )
