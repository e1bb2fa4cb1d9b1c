"""What ``check`` does after a divergence inside compiled code: localise it to a compiled graph,
output and kernel (two kernel replays, run side by side), and re-run the script with each
candidate fix (two truncated runs each) to find the cheapest fix that is really bit-exact; for
``--against eager``, the backend stages at which results first change.

The decisions are pure (:mod:`torchrepro.analysis.fix_ranking`); this module only launches and reads.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...analysis.divergence import Divergence, Tolerance, first_divergence, steps_compared
from ...analysis.graph_steps import GraphScope
from ...analysis.fix_ranking import (
    BackendStages,
    Candidate,
    FixRow,
    FixRun,
    Stage,
    candidates,
    first_changing_stage,
    StepTimes,
    judge_fix,
    WARMUP_STEPS,
    MIN_TIMED,
)
from ...errors import InputError
from ...eventlog.events import Compile, Step
from ...eventlog.payloads import ExplainedOutput, KernelCall, KernelSummary
from ...eventlog.rundir import Run, usable_cores
from ...reports.check_report import Evidence
from .runs import intra_op_threads

if TYPE_CHECKING:
    from .runs import Checker, RunSpec

STEPS_AFTER = 2  # a fix's runs stop this many steps after the divergent step (at least after TIMED_UNTIL)
TIMED_UNTIL = WARMUP_STEPS + 2 * MIN_TIMED - 1  # ... so that each has steps to time after warm-up
BASELINE = "fix-baseline"  # the run as written, truncated like the fixes' runs: what their step times divide by
FIX_TIMEOUT_S = 300.0


# A race between threads may not recur in a given replay: kernel replays run in pairs until a pair
# shows a difference (graph call by graph call, or in the in-process repeats), at most REPLAY_PAIRS
# pairs, and no new pair once REPLAY_BUDGET_S (or twice the slowest run as written) has passed.
REPLAY_PAIRS = 3
REPLAY_BUDGET_S = 240.0


GraphCall = KernelCall  # one compiled graph call of a kernel replay
Output = ExplainedOutput  # a compiled graph's output explained by a kernel replay
KernelReplay = KernelSummary  # a kernel replay's record (``kernels`` of its replay file)


Difference = tuple[GraphCall, int]  # a graph call and the index of its output that differs


def _first_repeat_difference(calls: list[GraphCall]) -> Difference | None:
    for call in calls:
        if call.get("repeat_differs"):
            return call, int(next(iter(call["repeat_differs"])))
    return None


def _calls(kernels: KernelReplay) -> list[GraphCall]:
    """Every compiled graph call of a kernel replay in order: those before the replayed step, then
    the step's own (marked ``at_step``)."""
    return [*kernels.get("before", []), *(_at_step(c) for c in kernels["calls"])]


def _at_step(call: GraphCall) -> GraphCall:
    return {**call, "at_step": True}


def first_cross_difference(a: list[GraphCall], b: list[GraphCall]) -> tuple[Difference | None, str | None]:
    """Two processes' graph calls compared in order: the first call whose inputs agree and whose
    outputs do not (the call, the output's index), else None and, when the processes parted
    elsewhere, where (other graphs called, or a call's inputs differing while every earlier output
    agreed: the difference entered outside compiled code)."""
    for n, (x, y) in enumerate(zip(a, b)):
        where = f"graph call {n + 1} ({x['compile_id']} {x['graph']})"
        if (x["compile_id"], x["graph"]) != (y["compile_id"], y["graph"]):
            return None, f"{where}: the replays called different graphs"
        if x["inputs"] != y["inputs"]:
            return None, f"{where}: inputs differ while every earlier output agreed (outside compiled code)"
        for i, (p, q) in enumerate(zip(x["outputs"], y["outputs"])):
            if p != q:
                return (x, i), None
    return None, None


def _replay_pair(
    checker: Checker, spec_a: RunSpec, spec_b: RunSpec, div: Divergence, runs: list[Run], attempt: int
) -> list[KernelReplay]:
    """Two kernel replays of the divergent step, side by side where the cores allow both replays'
    threads (a race between threads that take turns on a core rarely shows); their records."""
    suffix = "" if attempt == 0 else str(attempt + 1)
    with ThreadPoolExecutor(max_workers=min(2, _jobs(runs))) as pool:
        jobs = [
            pool.submit(checker.replay, spec, div.step, tag + suffix, kernels=True, rank=div.rank)
            for spec, tag in ((spec_a, "kernels-a"), (spec_b, "kernels-b"))
        ]
        replays = [job.result() for job in jobs]
    for tag, replay in zip(("kernels-a", "kernels-b"), replays):
        errors = ((replay or {}).get("kernels") or {}).get("errors")
        if errors:  # what failed inside the replay's own checks, said with the rest
            checker.replay_failures[tag + suffix] = "; ".join(errors[:2])
    return [r["kernels"] for r in replays if r and "kernels" in r]


def localize_kernels(
    checker: Checker,
    spec_a: RunSpec,
    spec_b: RunSpec,
    div: Divergence,
    runs: list[Run],
    scope: GraphScope | None = None,
) -> Evidence | None:
    """Replay the divergent step compiled in pairs of processes (:data:`REPLAY_PAIRS`), each
    recording every compiled graph call's input and output digests and, at the step, repeating
    each call on identical inputs. The first call whose outputs differ on equal inputs between
    the two processes names the graph, output and kernel; a difference within one process's
    repeats is supporting evidence (and names it when the processes agree). None when no pair
    showed a difference, or every replay failed (``checker.replay_failures`` says why). Only calls
    of graphs that can explain the divergent quantity (``scope``) are compared."""

    def admitted(calls: list[GraphCall]) -> list[GraphCall]:
        return [c for c in calls if scope is None or scope.admits(c["compile_id"], c["graph"])]

    budget = max(REPLAY_BUDGET_S, 2 * max((float(r.meta.get("wall_s") or 0) for r in runs), default=0.0))
    start, attempts, parted = time.monotonic(), 0, None
    across = within = None
    found: list[KernelReplay] = []
    while attempts < REPLAY_PAIRS and (attempts == 0 or time.monotonic() - start < budget):
        found = _replay_pair(checker, spec_a, spec_b, div, runs, attempts)
        attempts += 1
        if len(found) == 2:
            across, parted = first_cross_difference(admitted(_calls(found[0])), admitted(_calls(found[1])))
        within = next((hit for k in found for hit in [_first_repeat_difference(admitted(k["calls"]))] if hit), None)
        if across or within or not found:
            break
    hit = across or within
    if hit is None:
        return None
    call, index = hit
    return _name_kernel(found, call, index, within, across is not None, attempts, parted)


def _name_kernel(
    found: list[KernelReplay],
    call: GraphCall,
    index: int,
    within: Difference | None,
    by_processes: bool,
    attempts: int,
    parted: str | None,
) -> Evidence:
    """The evidence for the kernel behind output ``index`` of graph call ``call``: what names it
    (two processes' graph calls, or the in-process repeats), and the repeats' thread dependence."""
    explained = found[0]["explained"].get(f"{call['compile_id']}/{call['graph']}") or []
    named: Output = (
        explained[index].copy()
        if index < len(explained)
        else {"compile_id": call["compile_id"], "graph": call["graph"], "output_index": index}
    )
    what = f"gradient of {named['parameter']}" if named.get("parameter") else f"output {index}"
    when = "at the divergent step" if call.get("at_step") else "in a step before the divergent one"
    if by_processes:
        named_by = "replay_pair"
        because = (
            f"compiled graph {call['compile_id']} ({call['graph']}): {what} differs between two replays in "
            f"separate processes on equal inputs, {when} (pair {attempts} of at most {REPLAY_PAIRS})"
        )
    else:
        named_by = "in_process_repeat"
        because = f"compiled graph {call['compile_id']} ({call['graph']}): {what} differs when repeated in one process on identical inputs"
        if call["repeat_differs"].get(str(index)) is not None:
            because += f", by up to {call['repeat_differs'][str(index)]:.3g}"
    # the named graph's own call at the divergent step, repeated in one process (one that differed first)
    same_graph = [
        c for k in found for c in k["calls"] if (c["compile_id"], c["graph"]) == (call["compile_id"], call["graph"])
    ]
    repeat: Mapping[str, object] = (
        next((c for c in same_graph if c.get("repeat_differs")), same_graph[0]) if same_graph else {}
    )
    one = repeat.get("one_thread_differs")
    threads = {
        "threads": repeat.get("threads"),
        "repeats": repeat.get("repeats"),
        "repeats_differ": bool(repeat.get("repeat_differs")),
        "one_thread": None if one is None else ("differs" if one else "repeats bit for bit"),
    }
    if (
        by_processes
        and within
        and (within[0]["compile_id"], within[0]["graph"], within[1])
        == (
            call["compile_id"],
            call["graph"],
            index,
        )
    ):
        because += "; the in-process repeats show it too"
    elif by_processes and within:
        other = within[0]
        because += (
            f"; the in-process repeats show a difference in compiled graph {other['compile_id']} "
            f"({other['graph']}) output {within[1]}"
        )
    elif by_processes:
        because += "; the in-process repeats did not show it (the race did not recur in one process)"
    if one is not None:
        calls = f" over {repeat['repeats']} repeats" if repeat.get("repeats") else ""
        because += (
            f"; at 1 thread it repeats bit for bit{calls}"
            + (" (the difference depends on the thread count)" if threads["repeats_differ"] else "")
            if not one
            else "; it differs at 1 thread too"
        )
    if named.get("kernel_atomic_add"):
        because += f"; kernel {named['kernel']} accumulates with atomic adds"
    out = {
        "localisation": "compiled_kernel",
        "strength": "measured",
        "named_by": named_by,
        "because": because,
        "thread_dependence": threads,
        "replay_pairs": attempts,
        **named,
    }
    if parted:
        out["replays_parted"] = parted
    return Evidence.from_json(out)


def _offending(runs: list[Run], compile_id: str | None) -> tuple[list[int] | None, str | None]:
    if not compile_id:
        return None, None
    frame = compile_id.split("/")[0]
    function = next(
        (
            f"{c.function} ({Path(c.file).name}:{c.line})" if c.file else c.function
            for r in runs
            for log in r.logs
            for c in log.of(Compile)
            if c.compile_id == compile_id and c.function
        ),
        None,
    )
    return ([int(frame)] if frame.isdigit() else None), function


def _uses(runs: list[Run]) -> tuple[bool, bool]:
    compiles = [c for r in runs for log in r.logs for c in log.of(Compile)]
    return bool(compiles), any(c.inductor_s is not None or c.cache.get("fxgraph") for c in compiles)


def step_times(run: Run) -> StepTimes:
    """Rank 0's step times by index, for :func:`~torchrepro.analysis.fix_ranking.step_cost`: every step
    during which nothing was compiled (a recompile is warm-up too, not the price of a fix)."""
    times: StepTimes = {}
    compiled = False
    for event in run.logs[0].events if run.logs else []:
        if isinstance(event, Compile):
            compiled = True
        elif isinstance(event, Step):
            if event.time_s is not None and not compiled and not event.compiles:
                times[event.index] = event.time_s
            compiled = False
    return times


def _jobs(runs: list[Run]) -> int:
    """Fix runs side by side only where cores allow: the CPUs over the threads one run uses."""
    return max(1, usable_cores() // intra_op_threads(runs))


def _truncated(
    checker: Checker, label: str, title: str, mode: str | None, fix: str | None, stop: int, timeout: float
) -> tuple[FixRun, Run | None]:
    """One run stopping after step ``stop`` (with ``fix`` applied, or as written): how it ended and
    its step times."""
    from .runs import RunSpec

    try:
        run, _ = checker.run(RunSpec(label, mode, title), timeout=timeout, fix=fix, stop_after_step=stop)
    except InputError as exc:
        return FixRun(ok=False, problems=[str(exc)]), None
    end = checker.endings[label]
    timed_out = bool(run.meta.get("stalled_after_s"))
    return FixRun(ok=end.ok, problems=list(end.problems), timed_out=timed_out, step_times=step_times(run)), run


def _try(
    checker: Checker, candidate: Candidate, spec: RunSpec, stop: int, timeout: float
) -> tuple[list[FixRun], Run | None, Run | None]:
    mode = candidate.compile_mode or spec.compile_mode
    title = f"fix {candidate.name}, stopping after step {stop}"
    (r1, a), (r2, b) = (
        _truncated(checker, f"fix-{candidate.name}-{i}", title, mode, candidate.spec, stop, timeout) for i in (1, 2)
    )
    return [r1, r2], a, b


def run_fix_ladder(
    checker: Checker,
    spec: RunSpec,
    div: Divergence,
    cause: str,
    evidence: Evidence,
    as_written: list[Run],
    only: list[str] | None = None,
) -> list[FixRow]:
    """Each applicable candidate fix: two runs stopping ``STEPS_AFTER`` steps after the divergent
    step (at the earliest after :data:`TIMED_UNTIL`), compared bit for bit, with their step times
    against those of a baseline run as written in the same truncated configuration (run beside the
    fixes, so under the same load and with the same warm compile cache; the first run as written
    only when the baseline run fails) on the same step indices after warm-up
    (:func:`~torchrepro.analysis.fix_ranking.step_cost`)."""
    compiled, inductor = _uses(as_written)
    frames, function = _offending(as_written, evidence.compile_id)
    ladder = candidates(
        compiled=compiled,
        inductor=inductor,
        frames=frames,
        function=function,
        random_ops=cause == "rng" or bool(evidence.facts.get("random_nodes")),
    )
    if only:
        ladder = [c for c in ladder if c.name in only]
    stop = max(div.step + STEPS_AFTER, TIMED_UNTIL)
    tried = [c for c in ladder if c.applicable]
    checker.console.print(
        f"[dim]· fix ladder: {', '.join(c.name for c in tried)} (2 runs each, to step {stop}) and a baseline[/]",
        highlight=False,
    )
    # a fix that hangs is stopped: no event for 3x the slowest run as written (at least FIX_TIMEOUT_S)
    timeout = max([FIX_TIMEOUT_S, *(3 * float(r.meta.get("wall_s") or 0) for r in as_written)])
    with ThreadPoolExecutor(max_workers=_jobs(as_written)) as pool:
        base = pool.submit(
            _truncated,
            checker,
            BASELINE,
            f"as written, stopping after step {stop}",
            spec.compile_mode,
            None,
            stop,
            timeout,
        )
        outcomes = dict(zip([c.name for c in tried], pool.map(lambda c: _try(checker, c, spec, stop, timeout), tried)))
        base_run, _ = base.result()
    # the baseline's steps at the fixes' indices; the first run as written only when the baseline failed
    baseline = base_run.step_times if base_run.ok else next((step_times(r) for r in as_written if r.logs), None)
    rows: list[FixRow] = []
    for candidate in ladder:
        if candidate.name not in outcomes:
            rows.append(judge_fix(candidate, [], None, 0, baseline))
            continue
        results, a, b = outcomes[candidate.name]
        diverged, compared = None, 0
        if a is not None and b is not None:
            found, _ = first_divergence(a.logs, b.logs, Tolerance())
            diverged, compared = found is not None, steps_compared(a.logs, b.logs)
        rows.append(judge_fix(candidate, results, diverged, compared, baseline))
    return rows


def backend_stages(checker: Checker, done: dict[str, tuple[RunSpec, Run]]) -> BackendStages:
    """``--against eager``: eager → aot_eager → inductor with fallback_random → inductor, each
    compared bit for bit with the stage before; the first stage at which results change."""
    from .runs import RunSpec

    if "aot_eager" not in done:
        spec = RunSpec("aot_eager", None, "every compiled frame with backend='aot_eager'")
        run, _ = checker.run(spec, fix="aot_eager")
        done["aot_eager"] = (spec, run)
    order = [
        ("eager", "eager"),
        ("aot_eager", "aot_eager"),
        ("fallback-random", "fallback-random"),
        ("inductor", "compiled"),
    ]
    stages: list[Stage] = []
    for i, (name, label) in enumerate(order):
        stage: Stage = {"name": name, "run": label, "bit_exact_with_previous": None}
        if i and label in done and order[i - 1][1] in done:
            prev = done[order[i - 1][1]][1]
            found, _ = first_divergence(prev.logs, done[label][1].logs, Tolerance())
            stage["bit_exact_with_previous"] = found is None
            if found is not None:
                stage["first_divergent_step"] = found.step
        stages.append(stage)
    return {"stages": stages, "first_change": first_changing_stage(stages)}
