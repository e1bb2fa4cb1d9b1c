"""`torchrepro check` and `torchrepro diff`: run a script several times (or eager against
compiled), compare step by step, decide the cause of the first divergence, and localise it by
replaying the divergent step with op-level capture. This module launches the runs and replays and
reads them; the decisions are pure (:mod:`torchrepro.analysis.nondeterminism`)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, TypeVar

from rich.console import Console

from ...analysis.cache_misses import key_findings, warm_start_findings
from ...analysis.graph_steps import GraphScope, step_scope
from ...analysis.nondeterminism import (
    FIXABLE,
    Decision,
    cause_from_decomposition,
    cause_from_kernels,
    cause_from_replays,
    compare,
    decide,
    determinism_section,
    divergence_findings,
    graph_evidence,
    graph_probes,
    hint_key,
    name_the_race,
    not_localised,
    numerics_of_modes,
    numerics_without_inductor,
    probe_divergence,
    shared_files,
    uses_inductor,
)
from ...analysis.divergence import Divergence, Tolerance, divergence_curve, final_within, first_divergence
from ...eventlog.payloads import JsonObject
from ...reports.check_report import Evidence, GraphProbeRecord
from ...reports.findings import Finding, Verdict
from ...analysis.fix_ranking import FixRow, cost_text, recommend
from ...analysis.nonfinite import nonfinite_findings, of_runs
from ...analysis.sides import side, step_comparison
from ...analysis.verdict import compare_lengths, ending, verdict_line
from ...errors import InputError, UserError
from ...eventlog.events import Step
from ..launcher import validate_script
from ...runtime.run_options import PROBE_REPEATS, RunOptions
from ...eventlog.provenance import launch_meta, provenance
from ...render.console import console as make_console
from ...reports.check_report import CheckReport, CheckRun, CurvePoint, Determinism
from ...eventlog.rundir import Run, create_run_dir, default_run_dir, load_run, release_run_dir
from ...render.save import write_report
from .disk import keep_evidence, planned_runs, require_disk
from .runs import Checker, RunSpec, plan_runs


def _snaps(run: Run) -> Path:
    """Rank 0's parameter snapshots (the divergence curve is drawn for rank 0)."""
    return run.logs[0].path.parent / "snapshots"


def localize(checker: Checker, spec_a: RunSpec, spec_b: RunSpec, div: Divergence, cause: str) -> Decision:
    """Replay the divergent step in both configurations with op capture (eagerly first when the
    configurations are the same) and name the first divergent op, its module and source."""
    same_config = spec_a.compile_mode == spec_b.compile_mode
    replay_a = checker.replay(spec_a, div.step, "a", eager=same_config, rank=div.rank)
    replay_b = checker.replay(spec_b, div.step, "b", eager=same_config, rank=div.rank)
    failure = "; ".join(f"replay {t}: {w}" for t, w in checker.replay_failures.items() if t in ("a", "b"))
    return cause_from_replays(cause, replay_a, replay_b, same_config, failure or None)


def localize_graph(
    checker: Checker, spec: RunSpec, div: Divergence, cause: str, scope: GraphScope, probes: list[GraphProbeRecord]
) -> Evidence:
    """Replay the divergent step compiled, checking each compiled graph against its eager FX
    graph: among the graphs that can explain the divergent quantity (``scope``), the first that
    departs from eager and the op where it does (:func:`~torchrepro.analysis.nondeterminism.graph_evidence`,
    with the compiled run's ``probes``)."""
    replay = checker.replay(spec, div.step, "graphs", graphs=True, rank=div.rank)
    return replace(graph_evidence(replay, scope, cause, checker.replay_failures.get("graphs"), probes), run=spec.label)


class DecompositionPair(TypedDict):
    """Two runs of the backend decomposition compared: bit for bit, and their last parameter snapshots:
    the largest absolute difference, the parameter it is in, and the whole difference's L2 norm
    relative to the parameters' (the size of the difference against the model's scale)."""

    between: list[str]
    bit_exact: bool
    final_max_abs: float | None
    final_parameter: str | None
    final_l2_rel: float | None


Decomposition = dict[str, DecompositionPair]  # "rng", "numerics", "total" (and "run_to_run")


def _decomposition(checker: Checker, runs: dict[str, tuple[RunSpec, Run]], against: str) -> Decomposition:
    """With inductor: eager, as written, and fallback_random=True separate RNG from numerics. When
    fallback_random=True and the run as written differ (the ``rng`` part), the run as written again,
    to the step they first differ at (``run_to_run``): a compiled run that is not itself reproducible
    there bounds the split (the ``rng`` part may be its own noise, not RNG)."""
    third = (
        RunSpec("eager", "eager", "compilation disabled")
        if against == "fallback-random"
        else RunSpec("fallback-random", "fallback-random", "fallback_random=True")
    )
    run, _ = checker.run(third)
    runs[third.label] = (third, run)
    eager, fallback, compiled = (runs[k][1] for k in ("eager", "fallback-random", "compiled"))
    pairs = {"rng": (fallback, compiled), "numerics": (eager, fallback), "total": (eager, compiled)}
    rng_step, _ = first_divergence(fallback.logs, compiled.logs, Tolerance())
    if rng_step is not None:
        again = RunSpec("compiled-again", None, f"as written again, to step {rng_step.step}")
        run, _ = checker.run(again, stop_after_step=rng_step.step)
        pairs["run_to_run"] = (compiled, run)
    out: Decomposition = {}
    for name, (x, y) in pairs.items():
        curve = divergence_curve(_snaps(x), _snaps(y), x.logs[0], y.logs[0])
        div, _ = first_divergence(x.logs, y.logs, Tolerance())  # bit for bit
        out[name] = {
            "between": [x.path.name, y.path.name],
            "bit_exact": div is None,
            "final_max_abs": curve[-1]["max_abs"] if curve else None,
            "final_parameter": curve[-1]["parameter"] if curve else None,
            "final_l2_rel": curve[-1]["l2_rel"] if curve else None,
        }
    return out


def _curve(run_a: Run, run_b: Run) -> list[CurvePoint]:
    """The parameter difference per snapshot step, read from the two runs' snapshots (rank 0)."""
    return divergence_curve(_snaps(run_a), _snaps(run_b), run_a.logs[0], run_b.logs[0])


def _compare(run_a: Run, run_b: Run, tol: Tolerance) -> tuple[Divergence | None, bool, list[str]]:
    """:func:`~torchrepro.analysis.nondeterminism.compare` of two runs, their final parameters held to
    ``tol`` on their last common snapshot when both have snapshots."""
    a, b = _snaps(run_a), _snaps(run_b)
    return compare(
        run_a.logs,
        run_b.logs,
        tol,
        (lambda: final_within(tol, a, b, run_a.logs[0], run_b.logs[0])) if a.is_dir() and b.is_dir() else None,
    )


Pair = tuple[tuple[RunSpec, Run], tuple[RunSpec, Run]]


def _earliest_divergence(
    checker: Checker, pairs: list[Pair], tol: Tolerance
) -> tuple[Divergence | None, bool, list[str], Pair]:
    """The earliest divergence (by step, then rank) over ``pairs`` (each run with the first), the
    pair it is in (else the first pair), whether any pair differed only within ``tol``, and every
    pair's notes; each pair's lengths are compared into the checker's endings."""
    div, within, notes, pair = None, False, [], pairs[0]
    for (sa, ra), (sb, rb) in pairs:
        d, w, n = _compare(ra, rb, tol)
        compare_lengths(checker.endings[sa.label], checker.endings[sb.label], diverged=d is not None)
        notes += n
        within = within or w
        if d is not None and (div is None or (d.step, d.rank) < (div.step, div.rank)):
            div, pair = d, ((sa, ra), (sb, rb))
    return div, within, notes, pair


T = TypeVar("T")


def _guarded(what: str, cause: str, fn: Callable[..., T], *args: Any) -> tuple[T | None, Evidence]:
    """``(fn(*args), Evidence())``; a failure of the localisation itself (torchrepro's, not the user's
    run: a stop or a user error still ends the check) is ``(None, evidence)`` saying so, with the
    exception's first line and the cause still concluded."""
    try:
        return fn(*args), Evidence()
    except UserError:
        raise
    except Exception as exc:
        return None, not_localised(cause, f"{what}: " + f"{type(exc).__name__}: {exc}".splitlines()[0])


def _explain(
    checker: Checker,
    done: dict[str, tuple[RunSpec, Run]],
    pair: Pair,
    div: Divergence,
    against: str | None,
    localize_divergence: bool,
    scope: GraphScope,
    probed: Evidence | None = None,
) -> tuple[Decision, Decomposition | None]:
    """The cause of ``div`` between the runs of ``pair``, its evidence and (``--against`` with
    inductor) the backend decomposition: decided from the logs, then, while still unknown, from
    the decomposition, repeated kernels, or replays of the divergent step with op capture. Compiled
    graphs are blamed only where they can explain the quantity that differs (``scope``: for a
    gradient, graphs whose backward ran in that step, :mod:`torchrepro.analysis.graph_steps`).
    ``probed``: the evidence of such a graph the runs' own probes found nondeterministic, which names
    the kernel without kernel replays."""
    from .fix_ladder import localize_kernels

    (spec_a, run_a), (spec_b, run_b) = pair
    decomposition: Decomposition | None = None
    cause, evidence = decide(div, run_a.logs, run_b.logs, same_config=spec_a.compile_mode == spec_b.compile_mode)
    if against is not None and cause == "unknown":
        if uses_inductor(run_b.logs):
            decomposition = _decomposition(checker, done, against)
            cause, evidence = cause_from_decomposition(decomposition, against)
            if localize_divergence:
                probes = graph_probes({spec_b.label: run_b.logs})
                graph, failed = _guarded(
                    "the graph replay", cause, localize_graph, checker, spec_b, div, cause, scope, probes
                )
                evidence = evidence.but(graph or failed)
                race = probe_divergence(probes, scope) if cause == "nondeterministic_op" else None
                if race is not None:  # the compiled run's own race, found by its probe, is the cause's evidence
                    evidence = name_the_race(evidence, race[2])
        else:
            cause, evidence = numerics_without_inductor()
    kernels: Evidence | None = None
    if probed is not None and against is None and cause == "unknown":
        kernels = probed
        cause, evidence = cause_from_kernels(evidence, kernels)
    elif localize_divergence and against is None and cause == "unknown" and uses_inductor(run_a.logs):
        kernels, failed = _guarded(
            "the kernel replays", cause, localize_kernels, checker, spec_a, spec_b, div, [run_a, run_b], scope
        )
        evidence = evidence.but(failed)
        if kernels is not None:
            cause, evidence = cause_from_kernels(evidence, kernels)
    if (
        kernels is None
        and localize_divergence
        and (cause in ("unknown", "init_params") or against is None and cause == "numerics")
    ):
        found, failed = _guarded("the op replays", cause, localize, checker, spec_a, spec_b, div, cause)
        cause, more = found or (cause, failed)
        evidence = evidence.but(more)
    replays = [f"replay {t}: {w}" for t, w in checker.replay_failures.items() if t.startswith("kernels")]
    if replays:  # the kernel replays' own failures: said with what was concluded without them
        evidence = evidence.noted(
            f"kernel replays failed ({'; '.join(replays[:2])}); concluded without them: cause {cause}"
        )
    if evidence.compile_id is not None and evidence.scope is None:  # a graph named: what it was chosen among
        evidence = replace(evidence, scope=scope.text())
    return (cause, evidence), decomposition


@dataclass(frozen=True)
class CheckRequest:
    """What ``torchrepro check`` is asked to do, typed once (by the CLI or any other caller):
    run ``script`` with ``args`` ``runs`` times (or once against the reference ``against``) in
    ``run_dir`` (None: a new directory under ``torchrepro-runs/``), each run starting from
    ``options`` on ``nproc`` ranks (``timeout``: seconds without progress before a run is ended),
    and compare the runs within ``tolerance``. ``localize_divergence``: find where a divergence
    starts (replays); ``fixes``: run the fix ladder after a divergence (None: for causes a fix can
    address; True: always; False: never), limited to ``only_fixes`` when given;
    ``probe_repeats``: how often each run calls each compiled graph again (0: never);
    ``disk_budget``: the bytes the runs may need, in place of the estimate."""

    script: Path
    args: list[str]
    runs: int = 2
    options: RunOptions = RunOptions()
    against: str | None = None
    run_dir: Path | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    localize_divergence: bool = True
    nproc: int = 1
    timeout: float | None = None
    fixes: bool | None = None
    only_fixes: list[str] | None = None
    probe_repeats: int = PROBE_REPEATS
    disk_budget: int | None = None


def check(request: CheckRequest, console: Console | None = None) -> tuple[CheckReport, Path]:
    """Run, compare, explain as ``request`` says; returns the report (also written to
    ``RUN_DIR/report.json``) and the run directory. Refused before any run when the disk cannot
    hold the runs (:mod:`.disk`). A graph that differs on identical inputs is a divergence even
    where the runs agree."""
    from .fix_ladder import backend_stages, run_fix_ladder

    console = console or make_console(stderr=True)
    tol = request.tolerance
    script = validate_script(request.script)
    if request.runs < 2 and request.against is None:
        raise InputError("--runs must be at least 2 (there is nothing to compare with one run)")
    snapshots = request.against is not None or not tol.exact
    run_dir = request.run_dir or default_run_dir(script, label="check")
    require_disk(run_dir, planned_runs(request.runs, request.against, request.fixes), snapshots, request.disk_budget)
    run_dir = create_run_dir(run_dir)
    seed = request.options.seed
    checker = Checker(
        script,
        request.args,
        run_dir,
        options=replace(
            request.options, probe_repeats=request.probe_repeats, probe_against_eager=request.against is not None
        ),
        snapshots=snapshots,
        console=console,
        nproc=request.nproc,
        timeout=request.timeout,
    )
    specs = plan_runs(request.runs, request.against)
    done = {spec.label: (spec, run) for spec, (run, _) in zip(specs, checker.run_all(specs))}
    (spec_a, run_a), (spec_b, run_b) = done[specs[0].label], done[specs[-1].label]
    pairs = [(done[specs[0].label], done[s.label]) for s in specs[1:]]
    div, within, notes, pair = _earliest_divergence(checker, pairs, tol)
    (spec_a, run_a), (spec_b, run_b) = pair
    probes = graph_probes({label: run.logs for label, (_, run) in done.items()})
    # where the runs diverge, a graph is blamed only where it can explain what differs (graph_steps)
    scope = step_scope(div.what, div.step, run_b.logs, div.rank) if div is not None else None
    probed = probe_divergence(probes, scope) if request.against is None else None
    only_probed = div is None and probed is not None  # the runs agree; a graph repeated in one did not
    shared = checker.shared_cores_note([run for _, run in done.values()]) if div is None and not only_probed else None
    notes += [shared] if shared else []
    crossings = [(c.path, c.wrote, c.read) for c in checker.workdirs.crossings if c.read in done]
    notes += workdir_notes(checker, crossings_named=div is not None and bool(crossings))
    decision: Decision | None = None
    decomposition: Decomposition | None = None
    ladder: list[FixRow] = []
    if div is not None and crossings:  # the runs did not start from the same files: nothing else is blamed
        decision = shared_files(crossings)
    elif probed is not None and only_probed:
        div, decision, within = probed[0], probed[1:], False
    elif div is not None:
        assert scope is not None
        decision, decomposition = _explain(
            checker, done, pair, div, request.against, request.localize_divergence, scope, probed[2] if probed else None
        )
        cause, evidence = decision
        if evidence.localisation_note:  # a failure of localisation is said, never hidden
            notes.append(evidence.localisation_note)
        if request.fixes is not False and request.against is None and (request.fixes or cause in FIXABLE):
            ladder = run_fix_ladder(checker, spec_b, div, cause, evidence, [run_a, run_b], request.only_fixes)
    stages = None
    if decomposition is not None and request.against == "eager" and request.fixes is not False:
        stages = backend_stages(checker, done)
    more: JsonObject = {"decomposition": decomposition} if decomposition is not None else {}
    if ladder:
        more |= {"fixes": ladder, "fix_recommended": recommend(ladder)}
    if stages is not None:
        more["backend_stages"] = stages
    if probes:
        more["graph_probes"] = probes
    det = determinism_section(
        div,
        within,
        decision,
        [s.label for s in specs],
        run_a.logs,
        run_b.logs,
        _curve(run_a, run_b) if snapshots else [],
        notes,
        [checker.endings[s.label] for s in specs],
        tol,
        unreadable_exit=3,
        pair=(spec_a.label, spec_b.label),
        against=request.against,
        more=more | {"against": request.against},
    )
    same_config = [(sa.label, ra, sb.label, rb) for (sa, ra), (sb, rb) in pairs if sa.compile_mode == sb.compile_mode]
    report = _report(
        det,
        hint_key(decision[0], request.against, run_b.logs, decision[1]) if decision else None,
        {s.label: str(run_dir / s.label) for s in specs}
        | ({"decomposition": str(run_dir / list(done)[-1])} if decomposition else {}),
        checker.timings,
        {
            **launch_meta(script),
            "script": str(script),
            "args": request.args,
            "seed": seed,
            "runs": request.runs,
            "against": request.against,
            **request.options.warm_start_meta,
        },
        [f for pair in same_config for f in cache_key_findings(*pair)]
        + nonfinite_of({s.label: done[s.label][1] for s in specs})
        + warm_start_findings(request.options.warm_start_meta),
        (run_a, run_b),
    )
    # what the report was drawn from, cut to the evidence (commands/check/disk.py) before the report is written:
    # the size it prints is what stays on disk
    keep_evidence(run_dir, [spec_a.label, spec_b.label], div is not None or within, div.step if div else None)
    write_report(run_dir, report)
    return report, run_dir


def workdir_notes(checker: Checker, crossings_named: bool) -> list[str]:
    """What the notes say of where the runs started (:mod:`torchrepro.commands.workdir`): files a
    run wrote in its own copy of the working directory (no other run saw them), runs that ran in
    the shared directory and why, and a file an earlier run wrote there that a later run read
    (unless the cause names it: ``crossings_named``)."""
    ledger, notes = checker.workdirs, []
    wrote = sorted(
        (label, files) for label, files in ledger.wrote_in_copies().items() if not label.startswith("replay")
    )
    if wrote:
        label, files = wrote[0]
        notes.append(
            "each run started in a fresh copy of the working directory; what a run wrote there no other run saw "
            f"({label} wrote {', '.join(files[:3])}{' …' if len(files) > 3 else ''})"
        )
    why = next((w.why_shared for w in ledger.workdirs.values() if w.why_shared), None)
    if why:
        notes.append(f"the runs ran in the working directory itself, not in copies: {why}")
    if not crossings_named:
        notes += [f"{c.wrote} wrote {c.path} in the working directory, {c.read} read it" for c in ledger.crossings[:3]]
    return notes


def nonfinite_of(runs: dict[str, Run]) -> list[Finding]:
    """Non-finite losses, gradients and parameters, and parameters never initialised, of the runs
    compared (by label): a finding every run has alike said once (:mod:`torchrepro.analysis.nonfinite`)."""
    return of_runs({label: nonfinite_findings(run.logs) for label, run in runs.items()})


def cache_key_findings(label_a: str, run_a: Run, label_b: str, run_b: Run) -> list[Finding]:
    """Compile-cache lookups of run B that could not reuse run A's entries: which key component differs."""
    ranks_b = {log.rank: log for log in run_b.logs}
    return [
        f
        for log_a in run_a.logs
        if log_a.rank in ranks_b
        for f in key_findings(
            log_a.events,
            ranks_b[log_a.rank].events,
            f"{label_a} rank {log_a.rank}",
            f"{label_b} rank {log_a.rank}",
        )
    ]


def _report(
    det: Determinism,
    hint_key: str | None,
    run_dirs: dict[str, str],
    timings: dict[str, float],
    meta: JsonObject,
    extra: Sequence[Finding] = (),
    compared: tuple[Run, Run] | None = None,
) -> CheckReport:
    line = verdict_line(det)
    best = det.more.get("fix_recommended")
    if best:
        line += f"; measured fix: {best['name']} (bit-exact, {cost_text(best)})"
    first_change = (det.more.get("backend_stages") or {}).get("first_change")
    if first_change:
        line += f"; results first change at {first_change['stage']} (vs {first_change['previous']})"
    report = CheckReport(CheckRun(run_dirs, timings, meta), det, divergence_findings(det, hint_key) + list(extra), line)
    if compared:  # the two runs side by side (the HTML report draws them)
        a, b = compared
        report.provenance = provenance({**a.meta, **meta}, a.logs[0].header)
        # every run of a check ran the same script: its commit, recorded once for the check, is each run's
        report.sides = [
            side(label, str(r.path), {"git": meta.get("git"), **r.meta}, r.logs) for label, r in zip(det.runs, compared)
        ]
        rank = det.first_divergence.rank if det.first_divergence else a.logs[0].rank
        log_a = next((log for log in a.logs if log.rank == rank), a.logs[0])
        log_b = next((log for log in b.logs if log.rank == log_a.rank), b.logs[0])
        report.step_comparison = step_comparison(log_a, log_b)
    return report


def _script_of(run: Run) -> str | None:
    """The file name of the script a run ran, as its run.json says."""
    script = run.meta.get("script")
    return Path(str(script)).name if script else None


def _missing_evidence(*runs: Run) -> list[str]:
    """What stored runs did not record that a divergence can first show in: gradients (``torchrepro run
    --grads``) and parameters after every step (``--fingerprint-every 1``; by default capture spends at
    most 1 % of the step time on them). ``check`` records both in its runs."""
    steps = [s for run in runs for log in run.logs for s in log.of(Step)]
    if not steps:
        return []
    lacking = []
    if not any(s.grads_fp for s in steps):
        lacking.append("no gradient fingerprints (torchrepro run --grads records them)")
    fingerprinted = sum(s.params_fp is not None for s in steps)
    if fingerprinted < len(steps):
        lacking.append(
            f"parameter fingerprints at {fingerprinted} of {len(steps)} steps (torchrepro run --fingerprint-every 1 "
            "records every step)"
        )
    if not lacking:
        return []
    return ["the runs hold " + " and ".join(lacking) + ": the first divergence may be earlier than the step named"]


def diff(
    path_a: Path,
    path_b: Path,
    tolerance: Tolerance | None = None,
    explain: Callable[[Divergence, str], Decision | None] | None = None,
) -> CheckReport:
    """Compare two stored runs (no replay: the evidence in their logs and snapshots). ``explain``: a
    caller that can replay run B (``golden check``) refines the cause of a divergence and its
    evidence (None: it could not)."""
    tol = tolerance or Tolerance()
    run_a, run_b = load_run(path_a), load_run(path_b)
    scripts = [_script_of(r) for r in (run_a, run_b)]
    if None not in scripts and scripts[0] != scripts[1]:
        raise InputError(
            f"{path_a} is a run of {scripts[0]}, {path_b} of {scripts[1]}: diff compares two runs of one script"
        )
    endings = [ending(str(path_a), run_a.meta, run_a.logs), ending(str(path_b), run_b.meta, run_b.logs)]
    for end, run in zip(endings, (run_a, run_b)):
        end.problems += run.unread  # a rank log that could not be read: the comparison cannot cover it
    div, within, notes = _compare(run_a, run_b, tol)
    compare_lengths(endings[0], endings[1], diverged=div is not None)
    notes = run_a.problems + run_b.problems + notes + _missing_evidence(run_a, run_b)
    decision = decide(div, run_a.logs, run_b.logs) if div is not None else None
    if decision is not None and decision[0] == "unknown":
        decision = numerics_of_modes(run_a.meta.get("compile_mode"), run_b.meta.get("compile_mode")) or decision
    if div is not None and decision is not None and explain and (found := explain(div, decision[0])) is not None:
        decision = found[0], decision[1].but(found[1])
    snapshots = _snaps(run_a).is_dir() and _snaps(run_b).is_dir()
    det = determinism_section(
        div,
        within,
        decision,
        [str(path_a), str(path_b)],
        run_a.logs,
        run_b.logs,
        _curve(run_a, run_b) if snapshots else [],
        notes,
        endings,
        tol,
        unreadable_exit=2,
    )
    key = hint_key(decision[0], None, run_b.logs) if decision else None
    return _report(
        det,
        "unknown_diff" if key == "unknown" else key,
        {"a": str(path_a), "b": str(path_b)},
        {},
        {**launch_meta(None), "diff": [str(path_a), str(path_b)]},
        cache_key_findings("A", run_a, "B", run_b) + nonfinite_of({"A": run_a, "B": run_b}),
        (run_a, run_b),
    )


RESUME_HINTS = {
    "data_order": "The resumed run sees other batches: restore the sampler epoch (sampler.set_epoch) and skip the "
    "batches already consumed (resume.apply(batches) right after iter(loader)).",
    "rng": "An RNG state was not restored, or restored before the DataLoader iterator drew its seed: save with "
    "torchrepro.checkpoint.save and restore with resume.apply(batches) after iter(loader).",
    "unknown": "Same batches and RNG, different results: the model or optimizer state (moments, step counts, LR "
    "scheduler, gradient scaler, buffers) is not fully saved and loaded.",
}


def _resume_notes(full: Run, stopped: Run, resumed: Run, at: int) -> list[str]:
    """What may explain a resume that differs although no step did: the runs already differ before
    the checkpoint, or the resumed run's steps are not numbered from ``at``."""
    notes = []
    before, _, _ = _compare(full, stopped, Tolerance())
    if before is not None:
        notes.append(
            f"the run is not reproducible before the checkpoint (step {before.step} differs between two "
            "runs): fix that first (torchrepro check)"
        )
    first_resumed = min((s.index for log in resumed.logs for s in log.of(Step)), default=None)
    if first_resumed != at:
        notes.append(
            f"the resumed run's first step is numbered {first_resumed}, expected {at}: call "
            "resume.apply(...) (it aligns the step numbers)"
        )
    return notes


def _check_resumed_ending(checker: Checker, full: Run, resumed: Run) -> None:
    """A resumed run that agrees on every step but ends at another step than the full run did, on
    some rank, did not end normally (a problem of its ending: the verdict cannot be bit-exact)."""
    last = {log.rank: log.of(Step)[-1].index for log in full.logs if log.of(Step)}
    last_resumed = {log.rank: log.of(Step)[-1].index for log in resumed.logs if log.of(Step)}
    if last != last_resumed:
        checker.endings["resumed"].problems.append(
            f"the resumed run ended at step {last_resumed}, the full run at {last}"
        )


def _remove_created(run_dir: Path, existed: bool) -> None:
    """Remove what a check that ends in a usage error created: ``run_dir`` itself, or (a directory the
    user made, empty before) what is in it."""
    release_run_dir(run_dir)
    if not existed:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for item in run_dir.iterdir():
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)


def check_resume(
    script: Path,
    args: list[str],
    *,
    at: int,
    options: RunOptions = RunOptions(),
    run_dir: Path | None = None,
    nproc: int = 1,
    timeout: float | None = None,
    console: Console | None = None,
) -> tuple[CheckReport, Path]:
    """Run to the end; run again stopping after step ``at`` with a checkpoint; resume from it in a
    fresh process; compare every step after ``at`` and the final parameters bit for bit.
    ``options``: what every run starts from."""
    from ...checkpoint import ENV_RESUME_FROM, ENV_SAVE_TO, ENV_STOP_AT

    console = console or make_console(stderr=True)
    script = validate_script(script)
    if at < 1:
        raise InputError("--at must be at least 1 (the step after which to stop and resume)")
    existed = run_dir is not None and run_dir.exists()
    run_dir = create_run_dir(run_dir or default_run_dir(script, label="resume"))
    seed = options.seed
    checker = Checker(
        script, args, run_dir, options=options, snapshots=False, console=console, nproc=nproc, timeout=timeout
    )
    full, _ = checker.run(RunSpec("full", None, "to the end"))
    steps = min((len(log.of(Step)) for log in full.logs), default=0)
    if at >= steps and checker.endings["full"].ok:
        _remove_created(run_dir, existed)
        raise InputError(
            f"--at {at}: the run has {steps} step(s), so nothing would run after the checkpoint; "
            f"choose --at below {steps} (nothing was kept)"
        )
    saved = run_dir / "checkpoint"
    stopped, _ = checker.run(
        RunSpec("stopped", None, f"stopping after step {at}"),
        env={ENV_STOP_AT: str(at), ENV_SAVE_TO: str(saved.resolve())},
    )
    if not list(saved.glob("position-rank*.json")):
        raise InputError(
            f"the script saved no checkpoint after step {at}: it must call torchrepro.checkpoint.save() "
            "when checkpoint.plan().should_stop(step) (see examples/resume_ddp.py)"
        )
    resumed, _ = checker.run(
        RunSpec("resumed", None, f"resumed after step {at}"), env={ENV_RESUME_FROM: str(saved.resolve())}
    )
    div, _, notes = _compare(full, resumed, Tolerance())
    notes = [n for n in notes if "with the same index" not in n] + _resume_notes(full, stopped, resumed, at)
    if div is None:
        _check_resumed_ending(checker, full, resumed)
    decision = decide(div, full.logs, resumed.logs) if div is not None else None
    det = determinism_section(
        div,
        False,
        decision,
        ["full", "resumed"],
        full.logs,
        resumed.logs,
        [],
        notes,
        list(checker.endings.values()),
        Tolerance(),
        unreadable_exit=3,
        first_step=at,
        more={"resume_at": at},
    )
    report = _report(
        det,
        None,
        {
            "full": str(run_dir / "full"),
            "stopped": str(run_dir / "stopped"),
            "resumed": str(run_dir / "resumed"),
            "checkpoint": str(saved),
        },
        checker.timings,
        {**launch_meta(script), "script": str(script), "args": args, "seed": seed, "resume_at": at, "nproc": nproc},
        nonfinite_of({"full": full, "resumed": resumed}),
        compared=(full, resumed),
    )
    if det.verdict is Verdict.BIT_EXACT:
        report.verdict_line = (
            f"BIT-EXACT RESUME: stopping after step {at} and resuming in a fresh process gives "
            f"the same {det.steps_compared} steps and final parameters"
        )
    elif decision is not None:
        report.findings[0].hint = RESUME_HINTS.get(decision[0], RESUME_HINTS["unknown"])
    write_report(run_dir, report)
    return report, run_dir
