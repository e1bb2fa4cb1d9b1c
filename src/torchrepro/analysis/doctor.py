"""The doctor report (:class:`~torchrepro.reports.doctor_report.DoctorReport`): compile health, steps, the run's
outcome, and budgets — from events."""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass

from ..eventlog.event_reader import STEPS_CUT, EventLog
from ..eventlog.events import PROBE_MISS, CacheLookup, Capability, Compile, Counters, End, GraphBreak, Header
from ..eventlog.provenance import provenance
from ..reports.doctor_report import CacheCounts, CompileSection, DoctorReport, DoctorRun, RankSteps, StepsSummary
from ..reports.findings import Verdict
from . import compile as compile_analysis
from .cache_misses import rank_key_findings, warm_start_findings
from ..eventlog.payloads import JsonObject
from ..reports.findings import Finding, sort_findings
from .kept_steps import KeptSteps, kept_steps
from .nonfinite import CODES as NONFINITE_CODES, nonfinite_findings
from .rank_groups import graph_break_groups, rank_groups, recompile_groups
from .ranks import (
    fault_findings,
    launcher_finding,
    missing_ranks,
    placement,
    rank_findings,
    rank_write_failures,
    world_findings,
    world_size,
    write_failure,
)
from .timeline import timeline

# Error findings that fail a run like a budget: compiled code silently running eager, replicas
# that train on different parameters, a report over fewer ranks than the job has, a training on
# uninitialised memory or on values that are not finite.
FAILING_CODES = (
    "NOTHING_OBSERVED",
    "RECOMPILE_LIMIT_HIT",
    "NO_GRAPH_COMPILED",
    "INIT_PARAMS_DIFFER",
    "REPLICAS_DIFFER_FROM_START",
    "REPLICAS_DIVERGE",
    "RANKS_MISSING",
    *NONFINITE_CODES,
    "STEPS_LOST",
)


@dataclass
class Budgets:
    """CI budgets: a run that exceeds one fails (exit 1)."""

    max_graph_breaks: int | None = None
    max_recompiles: int | None = None
    min_cache_hit_rate: float | None = None
    strict: bool = False  # capture that degraded (CAPTURE_DEGRADED) fails the run too


LOSS_CURVES = 8  # ranks whose loss curve the report keeps (the first that recorded a loss)


def steps_summary(kept: dict[int, KeptSteps]) -> StepsSummary:
    """Per rank: step count, first/last loss, median step time (that of the steps that did not
    compile; else of all), steps that compiled; the loss curves of the first :data:`LOSS_CURVES`
    ranks that recorded a loss."""
    per_rank = {
        str(rank): RankSteps(
            steps=k.count,
            first_loss=k.first_loss,
            last_loss=k.last_loss,
            total_time_s=round(k.total_time_s, 3),
            median_step_s=round(k.median_s, 6) if k.median_s is not None else None,
            compile_steps=k.compile_steps,
            fingerprinted_steps=k.fingerprinted,
        )
        for rank, k in kept.items()
    }
    curves = [(rank, k.losses) for rank, k in sorted(kept.items()) if k.losses][:LOSS_CURVES]
    return StepsSummary(
        max((r.steps for r in per_rank.values()), default=0), per_rank, {str(rank): c for rank, c in curves}
    )


def run_summary(meta: JsonObject, logs: list[EventLog], problems: list[str], kept: dict[int, KeptSteps]) -> JsonObject:
    """The ``run`` section: what ran, where, how it ended, per rank."""
    headers: list[Header] = [h for h in (log.header for log in logs) if h is not None]
    first = headers[0] if headers else None
    ranks = {}
    where = placement(logs)
    for log in logs:
        end: End | None = log.end
        ranks[str(log.rank)] = {
            "exit_code": end.exit_code if end else None,
            "status": end.status if end else "incomplete",
            "error": end.error if end else None,
            "last_step": kept[log.rank].last_index,
            "duration_s": end.duration_s if end else None,
            **where[log.rank],
        }
    launcher = launcher_finding({"ranks": ranks}, meta)
    return {
        **meta,
        "failed": any(r["status"] not in ("ok", "imported") for r in ranks.values())
        or "stall" in meta
        or (launcher is not None and launcher.severity == "error")
        or "stopped_by" in meta
        or "interrupted" in meta,
        "torch_version": meta.get("torch_version") or (first.torch_version if first else None),
        "world_size": world_size(logs, meta),
        "env_fingerprint": meta.get("env_fingerprint") or (first.env_fingerprint if first else None),
        "ranks_present": [log.rank for log in logs],
        "ranks_missing": missing_ranks(logs, meta),
        "ranks": ranks,
        "problems": problems,
    }


def interrupted_line(meta: JsonObject, run: JsonObject) -> str | None:
    """Why a job reads as interrupted (``meta["interrupted"]``, set when its run directory is read: see
    :func:`~torchrepro.eventlog.rundir.supervisor_lost`) is said to be; None for any other run."""
    lost = meta.get("interrupted")
    if not isinstance(lost, dict):
        return None
    steps = [r["last_step"] for r in run["ranks"].values() if r["last_step"] is not None]
    last = f"last step seen: {max(steps) if steps else 'none'}"
    failed = lost.get("write_error")
    if isinstance(failed, dict):
        return (
            f"{write_failure(str(failed.get('errno')), str(failed.get('file')))}: torchrepro's supervisor (pid {lost.get('supervisor_pid')}) could not "
            f"record the end of the job; {last}"
        )
    return (
        f"torchrepro's supervisor (pid {lost.get('supervisor_pid')}) ended without recording the end of the job; {last}"
    )


def _outcome_findings(run: JsonObject, meta: JsonObject, logs: list[EventLog]) -> list[Finding]:
    findings = fault_findings(run, meta) + world_findings(logs, meta)
    interrupted = interrupted_line(meta, run)
    if interrupted is not None:
        failed = rank_write_failures(logs)
        if meta["interrupted"].get("write_error"):
            why = "Free some space (or fix the disk) and run it again for a verdict."
        elif failed:  # the supervisor's disk was the ranks': what ended it is recorded there, not guessed
            why = (
                f"The ranks' event logs could not be written ({failed[0]}): that is most likely what ended "
                "torchrepro too. Free some space (or fix the disk) and run it again for a verdict."
            )
        else:  # nothing recorded says why: no stop signal, no write that failed
            why = (
                "torchrepro was most likely killed by SIGKILL while the job ran (a guess: no stop signal and no "
                "failed write was recorded; the OOM killer is the usual cause); the job was ended with it."
            )
        findings.append(
            Finding(
                "RUN_INTERRUPTED",
                "error",
                f"interrupted: {interrupted}",
                hint=why + " Everything recorded before is analysed.",
                evidence={**meta["interrupted"], "last_steps": {r: i["last_step"] for r, i in run["ranks"].items()}},
            )
        )
    findings += warm_start_findings(meta)
    lost = {log.rank: log.steps_lost for log in logs if log.steps_lost}
    if lost:
        findings.append(
            Finding(
                "STEPS_LOST",
                "error",
                f"the step log of rank(s) {sorted(lost)} ends before the step its end record says was completed: "
                f"{sum(lost.values())} step(s) lost",
                hint="The log was cut short (a copy stopped early, a full disk, a file truncated): the steps, losses "
                "and times after the cut are missing from this report. Copy the whole run directory again, or rerun.",
                evidence={"steps_lost": {str(r): n for r, n in sorted(lost.items())}},
            )
        )
    problems = [p for p in run["problems"] if not p.endswith(STEPS_CUT)]  # said by STEPS_LOST
    if problems:
        skipped = sum(log.bad_lines for log in logs)
        findings.append(
            Finding(
                "EVENT_LOG_DAMAGED",
                "warning",
                f"{skipped} damaged line(s) skipped reading the event logs"
                if skipped
                else f"{len(problems)} problem(s) reading the event logs",
                hint="Damaged lines were skipped; everything else was read.",
                evidence={"problems": problems[:10]},
            )
        )
    return findings


# Capabilities whose absence loses evidence (the others are optional observers, e.g. fsdp2_init),
# and what is lost without them.
_DEGRADING = {
    "capture_error": "step events after the failure",
    "trace_records": "structured-trace records",
    "compile_events": "compile events",
    "steps": "step events",
    "batches": "batch fingerprints",
}


def probe_findings(logs: list[EventLog]) -> list[Finding]:
    """``NONDETERMINISTIC_COMPILED_GRAPH`` (``doctor --probe``): a compiled graph whose outputs were not
    bit for bit the same when called again on identical inputs, named as ``check`` names it."""
    from .nondeterminism import CAUSE_HINTS, graph_probes, probe_divergence

    probes = graph_probes({"run": logs})
    found = probe_divergence(probes)
    if found is None:
        return []
    _, _, evidence = found
    said = evidence.to_json()
    where = ", ".join(f"{k} {said[k]}" for k in ("parameter", "op", "kernel", "source") if said.get(k))
    hint = CAUSE_HINTS["nondeterministic_kernel" if evidence.kernel_atomic_add else "nondeterministic_op"]
    return [
        Finding(
            "NONDETERMINISTIC_COMPILED_GRAPH",
            "error",
            (evidence.because or "") + (f": {where}" if where else ""),
            hint=hint + " torchrepro repro RUN_DIR writes a standalone script that shows it.",
            evidence={**said, "graphs_probed": len(probes)},
        )
    ]


def capture_findings(logs: list[EventLog]) -> list[Finding]:
    """``CAPTURE_DEGRADED``: an observer that failed and was switched off, trace records that
    could not be read, an observer this torch version does not support."""
    lost: dict[str, JsonObject] = {}  # what was lost -> its finding's evidence
    for log in logs:
        for cap in log.of(Capability):
            if not cap.available and cap.name in _DEGRADING:
                entry = lost.setdefault(cap.name, {"what": cap.name, "note": cap.note, "ranks": [], "step": cap.step})
                entry["ranks"].append(log.rank)
        for counters in log.of(Counters):
            bad = counters.counters.get("torchrepro", {}).get("malformed_records", 0)
            if bad:
                note = "damaged or cut records were skipped, compile events may be missing"
                entry = lost.setdefault("trace_records", {"what": "trace_records", "note": note, "ranks": []})
                entry["records"] = entry.get("records", 0) + bad
                if log.rank not in entry["ranks"]:
                    entry["ranks"].append(log.rank)
    out = []
    for entry in lost.values():
        records = f" ({entry['records']} record(s))" if entry.get("records") else ""
        out.append(
            Finding(
                "CAPTURE_DEGRADED",
                "warning",
                f"capture degraded on rank(s) {sorted(entry['ranks'])}: lost {_DEGRADING[entry['what']]}"
                f"{records} — {entry['note'] or 'records could not be read'}",
                hint="What was lost is missing from this report; the rest is complete. Run with --strict "
                "to fail such runs; report the torch version if this repeats.",
                evidence=entry,
            )
        )
    return out


def observation_findings(logs: list[EventLog], steps: StepsSummary, run: JsonObject) -> list[Finding]:
    """``NOTHING_OBSERVED``: not one training step and not one compile (nor a graph break) in any
    process captured. No verdict rests on nothing: the training ran where capture did not reach
    (processes a launcher started out of its sight), took no step torchrepro recognises, or the
    script ended first."""
    if steps.steps or any(log.of(Compile) or log.of(GraphBreak) for log in logs):
        return []
    evidence: JsonObject = {"processes": [log.rank for log in logs], "steps": 0, "compiles": 0}
    stopped = [c.note for log in logs for c in log.of(Capability) if c.name == "capture_error" and not c.available]
    if stopped:  # torchrepro's own failure, not the script's: said as such
        how = f"torchrepro's {stopped[0]}, before the first step"
        hint = (
            "A failure of torchrepro's capture, not of your script (which ran untouched): report it with the "
            "torch version and the error above."
        )
        evidence["capture_error"] = stopped[0]
    else:
        ended = [r for r in run["ranks"].values() if r["status"] not in ("ok", "imported")]
        how = (
            "the script ended before its first step"
            if ended
            else "the training ran in processes torchrepro did not capture, or took no step it recognises"
        )
        hint = (
            "torchrepro counts a step at optimizer.step() (or backward() where no optimizer exists) and sees "
            "every torch.compile. A launcher that starts the training in processes of its own: launch each rank "
            'with torchrun ... -m torchrepro run (docs/commands.md, "Many ranks"), or give doctor the training '
            "script and --nproc N."
        )
    return [Finding("NOTHING_OBSERVED", "error", f"nothing to judge: {how}", hint=hint, evidence=evidence)]


COMPILE_TIME_WORTH_A_WARNING_S = (
    60.0  # compiling half of a run is a warning once it costs a minute: a short demo's is not
)


def _time_findings(compile_section: CompileSection, run: JsonObject) -> list[Finding]:
    durations = [r["duration_s"] for r in run["ranks"].values() if r["duration_s"]]
    if not durations or not compile_section["compile_time_s"]:
        return []
    share = compile_section["compile_time_s"] / max(sum(durations), 1e-9)
    compile_section["compile_time_share"] = round(share, 4)
    if share < 0.2:
        return []
    lookups = compile_section["cache"].values()
    hits, misses = sum(c["hit"] for c in lookups), sum(c["miss"] for c in lookups)
    if hits and not misses:  # the evidence says the cache is already warm: advising to warm it is wrong
        hint = f"Cut recompiles; the compile cache is already warm ({hits} hit{'' if hits == 1 else 's'}, no miss), so warming it saves nothing."
    else:
        hint = "Cut recompiles, or warm the compile cache (torchrepro cache pack/unpack)."
    return [
        Finding(
            "COMPILE_TIME_SHARE",
            "warning"
            if share >= 0.5 and compile_section["compile_time_s"] >= COMPILE_TIME_WORTH_A_WARNING_S
            else "info",
            f"compilation took {compile_section['compile_time_s']:.1f} s, {share:.0%} of the run",
            hint=hint,
            evidence={"compile_time_s": compile_section["compile_time_s"], "share": round(share, 4)},
        )
    ]


def _cache_findings(cache: dict[str, CacheCounts], logs: list[EventLog]) -> list[Finding]:
    """``CACHE_MISS`` per cache that missed; the misses ``--probe`` made (:data:`PROBE_MISS`) said as its own."""
    probed = Counter(x.cache for log in logs for x in log.of(CacheLookup) if x.reason == PROBE_MISS)
    out = []
    for name, c in cache.items():
        if not c["miss"]:
            continue
        ours = probed[name]
        hint = (
            "A cold cache is normal on a first run; on a restart it means the key changed "
            "(torchrepro cache explain-miss RUN_A RUN_B names the component)."
        )
        if ours:
            hint = (
                f"{ours} of these misses --probe made itself: the entry was in the cache, but the probe keeps a copy of "
                "each graph it probes and had none of this one, so it compiled it again (the next probed run hits). "
                + ("Nothing in your cache setup is to blame for them." if ours == c["miss"] else hint)
            )
        out.append(
            Finding(
                "CACHE_MISS",
                "info",
                f"{name} cache: {c['miss']} miss(es), {c['hit']} hit(s)"
                + (f"; {ours} of the misses made by --probe" if ours else ""),
                hint=hint,
                evidence={"cache": name, **c, **({"probe_misses": ours} if ours else {})},
            )
        )
    return out


def budget_failures(compile_section: CompileSection, budgets: Budgets) -> list[str]:
    """Reasons the run fails its budgets (empty when it passes)."""
    c = compile_section
    out = []
    if budgets.max_graph_breaks is not None and c["graph_breaks"] > budgets.max_graph_breaks:
        out.append(f"{c['graph_breaks']} graph breaks > budget {budgets.max_graph_breaks}")
    if budgets.max_recompiles is not None and c["recompiles"] > budgets.max_recompiles:
        out.append(f"{c['recompiles']} recompiles > budget {budgets.max_recompiles}")
    if budgets.min_cache_hit_rate is not None:
        for name, stats in c["cache"].items():
            rate = stats["hit_rate"]
            if rate is not None and rate < budgets.min_cache_hit_rate:
                out.append(f"{name} cache hit rate {rate:.2f} < budget {budgets.min_cache_hit_rate:.2f}")
    return out


def verdict_line(
    verdict: Verdict,
    findings: list[Finding],
    budget_failures: list[str],
    compile_section: CompileSection,
    steps: StepsSummary,
    interrupted: str | None = None,
) -> str:
    """The one-line summary at the top of the report."""
    c = compile_section
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning")}
    figures = (
        f"{c['compiles']} compile(s), {c['recompiles']} recompile(s), {c['graph_breaks']} graph "
        f"break(s), {c['compile_time_s']:.1f} s compiling, {steps.steps} step(s)"
    )
    if verdict is Verdict.INTERRUPTED:
        return f"INTERRUPTED: {interrupted} ({figures})"
    if verdict is Verdict.NOTHING_OBSERVED:
        processes = len(next(f for f in findings if f.code == "NOTHING_OBSERVED").evidence["processes"])
        return f"NOTHING OBSERVED: no training step and no compile seen in {processes} captured process(es)"
    if verdict is Verdict.FAILS_BUDGET:
        return f"FAILS BUDGET ({'; '.join(budget_failures)}): {figures}"
    if verdict is Verdict.PROBLEMS:
        return f"PROBLEMS ({counts['error']} error(s), {counts['warning']} warning(s)): {figures}"
    if verdict is Verdict.WARNINGS:
        return f"WARNINGS ({counts['warning']}): {figures}"
    return f"HEALTHY: {figures}"


def analyse(
    meta: JsonObject, logs: list[EventLog], problems: list[str], budgets: Budgets | None = None
) -> DoctorReport:
    """The whole doctor report from a run's events."""
    # The events just read are millions of acyclic objects (1024 ranks x 10 000 steps): frozen, the
    # cyclic collector does not traverse them in every collection the analysis triggers.
    gc.freeze()
    try:
        return _analyse(meta, logs, problems, budgets)
    finally:
        gc.unfreeze()


def _analyse(meta: JsonObject, logs: list[EventLog], problems: list[str], budgets: Budgets | None) -> DoctorReport:
    kept = kept_steps(logs)
    run = run_summary(meta, logs, problems, kept)
    compile_section, findings = compile_analysis.summarize(logs)
    steps = steps_summary(kept)
    findings += _outcome_findings(run, meta, logs) + _time_findings(compile_section, run)
    findings += _cache_findings(compile_section["cache"], logs) + rank_findings(logs, kept) + rank_key_findings(logs)
    findings += capture_findings(logs) + probe_findings(logs) + nonfinite_findings(logs, kept)
    findings += observation_findings(logs, steps, run)
    findings = sort_findings(findings)
    failures = budget_failures(compile_section, budgets or Budgets())
    failing = FAILING_CODES + (("CAPTURE_DEGRADED",) if budgets and budgets.strict else ())
    interrupted = interrupted_line(meta, run)
    verdict = Verdict.of_doctor(findings, failures, interrupted is not None)
    groups = rank_groups(logs, kept)
    compile_section["timeline"] = timeline(logs, groups["groups"], kept)
    compile_section["recompile_groups"] = recompile_groups(compile_section["recompile_events"])
    compile_section["graph_break_groups"] = graph_break_groups(compile_section["graph_break_events"])
    return DoctorReport(
        run=DoctorRun.from_json(run),
        compile=compile_section,
        steps=steps,
        findings=findings,
        verdict=verdict,
        verdict_line=verdict_line(verdict, findings, failures, compile_section, steps, interrupted),
        capabilities=compile_analysis.capabilities(logs),
        budget_failures=failures,
        failing_findings=[f.code for f in findings if f.code in failing],
        rank_groups=groups,
        provenance=provenance(meta, next((log.header for log in logs if log.header), None)),
    )
