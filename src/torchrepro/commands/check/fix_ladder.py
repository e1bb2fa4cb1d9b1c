"""What ``check`` does after a divergence inside compiled code: localise it to a compiled graph,
output and kernel (two kernel replays, run side by side), and re-run the script with each
candidate fix (two truncated runs each) to find the cheapest fix that is really bit-exact; for
``--against eager``, the backend stages at which results first change.

The decisions are pure (:mod:`torchrepro.analysis.fixes`); this module only launches and reads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...analysis.divergence import Divergence, Tolerance, first_divergence, settings, steps_compared
from ...analysis.fixes import Candidate, FixRun, candidates, first_changing_stage, judge_fix, median_step_time
from ...errors import InputError
from ...eventlog.events import Compile, Step
from ...eventlog.rundir import Run

if TYPE_CHECKING:
    from .runs import Checker, RunSpec

STEPS_AFTER = 2  # a fix's runs stop this many steps after the divergent step
FIX_TIMEOUT_S = 300.0


def _first_repeat_difference(calls: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
    for call in calls:
        if call.get("repeat_differs"):
            return call, int(next(iter(call["repeat_differs"])))
    return None


def _first_cross_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
    """The first graph call whose inputs agree between two replays and whose outputs do not."""
    for x, y in zip(a, b):
        if (x["compile_id"], x["graph"]) != (y["compile_id"], y["graph"]) or x["inputs"] != y["inputs"]:
            return None  # the replays already took different paths: not evidence about one kernel
        for i, (p, q) in enumerate(zip(x["outputs"], y["outputs"])):
            if p != q:
                return x, i
    return None


def localize_kernels(
    checker: Checker, spec_a: RunSpec, spec_b: RunSpec, div: Divergence, runs: list[Run]
) -> dict[str, Any] | None:
    """Replay the divergent step compiled, in two processes (side by side where the cores allow
    both replays' threads: a race between threads that have to take turns on a core rarely shows),
    repeating every compiled graph on identical inputs: the first output that differs (within a
    process, else between the two processes on identical inputs), named down to its kernel; None
    when every graph repeats."""
    with ThreadPoolExecutor(max_workers=min(2, _jobs(runs))) as pool:
        jobs = [
            pool.submit(checker.replay, spec, div.step, tag, kernels=True, rank=div.rank)
            for spec, tag in ((spec_a, "kernels-a"), (spec_b, "kernels-b"))
        ]
        replays = [job.result() for job in jobs]
    found = [r["kernels"] for r in replays if r and "kernels" in r]
    if not found:
        return None
    within = next((hit for k in found for hit in [_first_repeat_difference(k["calls"])] if hit), None)
    across = _first_cross_difference(found[0]["calls"], found[1]["calls"]) if len(found) == 2 else None
    hit = within or across
    if hit is None:
        return None
    call, index = hit
    explained = found[0]["explained"].get(f"{call['compile_id']}/{call['graph']}") or []
    named = (
        dict(explained[index])
        if index < len(explained)
        else {"compile_id": call["compile_id"], "graph": call["graph"], "output_index": index}
    )
    one = call.get("one_thread_differs")
    threads = {
        "threads": call.get("threads"),
        "repeats": call.get("repeats"),
        "repeats_differ": bool(call.get("repeat_differs")),
        "one_thread": None if one is None else ("differs" if one else "repeats bit for bit"),
    }
    how = (
        "repeated in one process on identical inputs" if within else "in the two replays' processes on identical inputs"
    )
    what = f"gradient of {named['parameter']}" if named.get("parameter") else f"output {index}"
    because = f"compiled graph {call['compile_id']} ({call['graph']}): {what} differs when {how}" + (
        f", by up to {call['repeat_differs'][str(index)]:.3g}"
        if within and call["repeat_differs"].get(str(index)) is not None
        else ""
    )
    if one is not None:
        calls = f" over {call['repeats']} repeats" if call.get("repeats") else ""
        because += (
            f"; at 1 thread it repeats bit for bit{calls} (the difference depends on the thread count)"
            if not one
            else "; it differs at 1 thread too"
        )
    if named.get("kernel_atomic_add"):
        because += f"; kernel {named['kernel']} accumulates with atomic adds"
    return {"localisation": "compiled_kernel", "because": because, "thread_dependence": threads, **named}


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


def _baseline(runs: list[Run], last: int) -> float | None:
    medians = [median_step_time([s.time_s for s in r.logs[0].of(Step) if s.index <= last]) for r in runs if r.logs]
    medians = [m for m in medians if m is not None]
    return sorted(medians)[len(medians) // 2] if medians else None


def _jobs(runs: list[Run]) -> int:
    """Fix runs side by side only where cores allow: the CPUs over the threads one run uses."""
    threads = max((int(settings(log).get("num_threads") or 1) for r in runs for log in r.logs), default=1)
    return max(1, (os.cpu_count() or 1) // max(threads, 1))


def _try(
    checker: Checker, candidate: Candidate, spec: RunSpec, stop: int, timeout: float
) -> tuple[list[FixRun], Run | None, Run | None]:
    from .runs import RunSpec

    results: list[FixRun] = []
    runs: list[Run | None] = []
    for i in (1, 2):
        label = f"fix-{candidate.name}-{i}"
        mode = candidate.compile_mode or spec.compile_mode
        try:
            run, _ = checker.run(
                RunSpec(label, mode, f"fix {candidate.name}, stopping after step {stop}"),
                timeout=timeout,
                fix=candidate.spec,
                stop_after_step=stop,
            )
        except InputError as exc:
            results.append(FixRun(ok=False, problems=[str(exc)]))
            runs.append(None)
            continue
        end = checker.endings[label]
        results.append(
            FixRun(
                ok=end.ok,
                problems=list(end.problems),
                timed_out=bool(run.meta.get("stalled_after_s")),
                step_times=[s.time_s for s in run.logs[0].of(Step)] if run.logs else [],
            )
        )
        runs.append(run)
    return results, runs[0], runs[1]


def run_fix_ladder(
    checker: Checker,
    spec: RunSpec,
    div: Divergence,
    cause: str,
    evidence: dict[str, Any],
    as_written: list[Run],
    only: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Each applicable candidate fix: two runs stopping ``STEPS_AFTER`` steps after the divergent
    step, compared bit for bit, with their median step time against the runs as written."""
    compiled, inductor = _uses(as_written)
    frames, function = _offending(as_written, evidence.get("compile_id"))
    ladder = candidates(
        compiled=compiled,
        inductor=inductor,
        frames=frames,
        function=function,
        random_ops=cause == "rng" or bool(evidence.get("random_nodes")),
    )
    if only:
        ladder = [c for c in ladder if c.name in only]
    stop = div.step + STEPS_AFTER
    baseline = _baseline(as_written, stop)
    tried = [c for c in ladder if c.applicable]
    checker.console.print(
        f"[dim]· fix ladder: {', '.join(c.name for c in tried)} (2 runs each, to step {stop})[/]", highlight=False
    )
    # a fix that hangs is stopped: no event for 3x the slowest run as written (at least FIX_TIMEOUT_S)
    timeout = max([FIX_TIMEOUT_S, *(3 * float(r.meta.get("wall_s") or 0) for r in as_written)])
    with ThreadPoolExecutor(max_workers=_jobs(as_written)) as pool:
        outcomes = dict(zip([c.name for c in tried], pool.map(lambda c: _try(checker, c, spec, stop, timeout), tried)))
    rows = []
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


def backend_stages(checker: Checker, done: dict[str, tuple[RunSpec, Run]]) -> dict[str, Any]:
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
    stages = []
    for i, (name, label) in enumerate(order):
        stage: dict[str, Any] = {"name": name, "run": label, "bit_exact_with_previous": None}
        if i and label in done and order[i - 1][1] in done:
            prev = done[order[i - 1][1]][1]
            found, _ = first_divergence(prev.logs, done[label][1].logs, Tolerance())
            stage["bit_exact_with_previous"] = found is None
            if found is not None:
                stage["first_divergent_step"] = found.step
        stages.append(stage)
    return {"stages": stages, "first_change": first_changing_stage(stages)}
