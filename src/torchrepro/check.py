"""`torchrepro check` and `torchrepro diff`: run a script several times (or eager against
compiled), compare step by step, decide the cause of the first divergence, and localise it by
replaying the divergent step with op-level capture."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from .analysis.cache import key_findings
from .analysis.divergence import (
    Divergence,
    Tolerance,
    compare_replays,
    compile_differences,
    divergence_curve,
    environment_differences,
    final_within,
    first_divergence,
    settings,
    steps_compared,
)
from .analysis.findings import Finding
from .analysis.fixes import fix_hint, recommend
from .analysis.sides import side, step_comparison
from .analysis.verdict import Ending, compare_lengths, ending, judge, nothing_compared_because, verdict_line
from .errors import InputError, Stopped
from .events import CacheLookup, Compile, Step
from .launch import ChildResult, child_env, launch, validate_script
from .provenance import launch_meta, provenance
from .report.model import CheckReport, CheckRun, Determinism
from .rundir import RUN_FILE, Run, create_run_dir, default_run_dir, load_run, replay_file, write_json, write_report

CAUSE_HINTS = {
    "data_order": "The batches differ: seed the data pipeline (torchrepro.seed_everything(seed) seeds samplers "
                  "and DataLoader workers; or DataLoader(generator=torchrepro.make_generator('loader'))) and never "
                  "seed from the clock.",
    "rng": "A random stream is not derived from the run's seed: create generators with "
           "torchrepro.make_generator or plan.fork, and call seed_everything at start.",
    "rng_compiled": "Inductor's random numbers differ from eager's: set torch._inductor.config.fallback_random = "
                    "True (torchrepro.deterministic(compile='match-eager')) when compiled must match eager.",
    "numerics": "Rounding differences (fused or reordered reductions) that grow over steps: expected between eager "
                "and compiled code; compare with --rtol/--atol.",
    "nondeterministic_op": "An op gives different results on identical inputs: torch.use_deterministic_algorithms("
                           "True) (torchrepro.deterministic()) makes it deterministic or raises.",
    "nondeterministic_kernel": "An inductor kernel accumulates floating-point sums with atomic adds from several "
                               "threads (a scatter or index_put with accumulation, e.g. the backward of an embedding): "
                               "the order of the additions, hence the rounding, changes from run to run. Why, and why "
                               "inductor's deterministic mode does not cover it: docs/compiled-nondeterminism.md.",
    "nondeterministic_op_deterministic_on": "An op gives different results on identical inputs although deterministic "
                                            "algorithms were on: the op is not covered by them (e.g. a parallel "
                                            "reduction in compiled code); try one intra-op thread "
                                            "(torch.set_num_threads(1)) or compile it with backend='aot_eager'.",
    "init_params": "The parameters differ before the first step: the model was initialised from an unseeded RNG (e.g. "
                   "built before Trainer or set_seed seeds). Seed before building the model "
                   "(torchrepro.seed_everything(seed), transformers.set_seed(seed)), or load the initial weights "
                   "from a checkpoint (under DDP/FSDP, broadcast them from rank 0).",
    "environment": "The runs' environments differ (thread counts, versions, TF32, determinism switches): pin them.",
    "recompile": "The runs compiled different graphs: run torchrepro doctor on each to see why.",
    "unknown": "No evidence points to one cause; rerun with more runs (--runs 3) to see if it repeats.",
}


LOCALISATION_KEYS = ("compile_id", "graph", "parameter", "output", "node", "kernel", "kernel_fuses")
FIXABLE = ("nondeterministic_op", "numerics", "unknown")  # causes the fix ladder runs for unasked


@dataclass
class RunSpec:
    """One run of a check: its label (folder name) and how compilation is configured."""

    label: str
    compile_mode: str | None  # None: as written; "eager"; "fallback-random"
    title: str


def plan_runs(runs: int, against: str | None) -> list[RunSpec]:
    if against is None:
        return [RunSpec(f"run-{i + 1}", None, f"run {i + 1} (as written)") for i in range(runs)]
    reference = RunSpec(against, against, "compilation disabled" if against == "eager" else "fallback_random=True")
    return [reference, RunSpec("compiled", None, "as written")]


class Checker:
    """Runs, compares and explains; one instance per ``check`` invocation."""

    def __init__(self, script: Path, args: list[str], out: Path, *, seed: int | None, snapshots: bool,
                 console: Console, nproc: int = 1, timeout: float | None = None, env: dict[str, str] | None = None):
        self.script, self.args, self.out, self.nproc, self.timeout = script, args, out, nproc, timeout
        self.env = env or {}
        self.seed, self.snapshots = seed, snapshots
        self.console = console
        self.timings: dict[str, float] = {}
        self.endings: dict[str, Ending] = {}

    def run(self, spec: RunSpec, env: dict[str, str] | None = None, timeout: float | None = None,
            **options: Any) -> tuple[Run, int]:
        run_dir = self.out / spec.label
        self.console.print(f"[dim]· {spec.label}: {spec.title}…[/]", highlight=False)
        t0 = time.perf_counter()
        result = launch(run_dir, self.script, self.args, nproc=self.nproc, quiet=True,
                        env=child_env(self.seed, {**self.env, **(env or {})}),
                        stall_timeout=timeout or self.timeout, seed=self.seed, fingerprint_every=1, grads=True,
                        compile_mode=spec.compile_mode, snapshots=self.snapshots, **options)
        self.timings[spec.label] = round(time.perf_counter() - t0, 3)
        meta = {"label": spec.label, "compile_mode": spec.compile_mode, "seed": self.seed, "script": str(self.script),
                "args": self.args, "exit_code": result.exit_code, "stderr_tail": result.stderr_tail,
                "rank_exit_codes": {str(r): c for r, c in result.rank_exit_codes.items()},
                "stalled_after_s": result.stalled_after_s, "wall_s": self.timings[spec.label],
                "stopped_by": result.stopped_by}
        write_json(run_dir / RUN_FILE, meta)
        self._stopped(result, spec.label)
        if not any(run_dir.glob("rank-*/events.jsonl")):
            raise InputError(f"{spec.label}: the script exited ({result.exit_code}) before capture started: "
                             + "; ".join(result.stderr_tail[-3:]))
        self.console.print(f"[dim]  done in {self.timings[spec.label]:.1f} s, exit {result.exit_code}[/]",
                           highlight=False)
        run = load_run(run_dir)
        self.endings[spec.label] = ending(spec.label, run.meta, run.logs)
        return run, result.exit_code

    def _stopped(self, result: ChildResult, what: str) -> None:
        """A signal to torchrepro stopped the job: the check ends here (exit 128 + N)."""
        if result.stopped_by:
            raise Stopped(f"{what}: stopped by {result.stopped_by}; the runs so far are in {self.out}",
                          result.stopped_by)

    def replay(self, spec: RunSpec, step: int, tag: str, eager: bool = False, graphs: bool = False,
               rank: int = 0, kernels: bool = False) -> dict | None:
        """Rerun ``spec`` up to ``step`` and record that step on ``rank``: every op, every compiled
        graph against eager (``graphs``), or every compiled graph repeated on identical inputs
        (``kernels``)."""
        out = self.out / "replays" / f"{tag}.json"
        mode = "eager" if eager else spec.compile_mode
        what = ("compiled graphs repeated on identical inputs" if kernels else
                "compiled graphs against eager" if graphs else "op capture")
        self.console.print(f"[dim]· replaying step {step} of {spec.label}{' eagerly' if eager else ''} with {what} "
                           f"({tag})…[/]", highlight=False)
        t0 = time.perf_counter()
        result = launch(self.out / "replays" / tag, self.script, self.args, nproc=self.nproc,
                        env=child_env(self.seed, self.env), quiet=True, stall_timeout=self.timeout, seed=self.seed,
                        fingerprint_every=1, compile_mode=mode, replay_step=step, replay_out=out, replay_graphs=graphs,
                        replay_kernels=kernels)
        self._stopped(result, f"replay {tag}")
        self.timings[f"replay {tag}"] = round(time.perf_counter() - t0, 3)
        out = replay_file(out, rank, self.nproc)
        return json.loads(out.read_text()) if out.exists() else None


def _snaps(run: Run) -> Path:
    """Rank 0's parameter snapshots (the divergence curve is drawn for rank 0)."""
    return run.logs[0].path.parent / "snapshots"


def _module_of_parameter(name: str | None) -> str | None:
    return name.rsplit(".", 1)[0] if name and "." in name else None


def _uses_inductor(run: Run) -> bool:
    return any(c.inductor_s is not None or c.cache.get("fxgraph") for log in run.logs for c in log.of(Compile))


def decide(div: Divergence, a: Run, b: Run, same_config: bool = True) -> tuple[str, dict[str, Any]]:
    """The cause that step-level evidence proves, or ``unknown`` (then localisation decides).
    Runs of different compile configurations are expected to compile differently."""
    if div.what == "init_params":
        return "init_params", {"because": "the parameters differ before the first forward "
                                          f"({div.detail.get('parameters_differing')} tensor(s), first "
                                          f"{div.detail.get('first_parameter')})"}
    if div.what == "batch":
        return "data_order", {"because": f"the batches of step {div.step} differ"}
    # Read at backward(), the state already reflects the forward pass: between different compile
    # configurations that is a consequence (inductor draws its seed from the global generator).
    if div.what == "rng" and (same_config or div.detail.get("read_at") != "backward"):
        at = {"batch": "when its first batch was fetched", "backward": "at its first backward()"}.get(
            div.detail.get("read_at"), "at its start")
        return "rng", {"because": f"the torch RNG state of step {div.step} differs ({at}): "
                                  + ", ".join(div.detail.get("streams") or []), "streams": div.detail.get("streams")}
    # a configuration's own switch (fallback_random) is not an environment difference
    env = environment_differences(a.logs[0].header, b.logs[0].header, ignore=() if same_config else ("fallback_random",))
    if env:
        return "environment", {"because": "the runs' environments differ", "differences": env}
    graphs = [d for la, lb in zip(a.logs, b.logs) for d in compile_differences(la, lb)] if same_config else []
    if graphs:
        return "recompile", {"because": "the runs compiled different graphs", "differences": graphs}
    return "unknown", {}


def localize(checker: Checker, spec_a: RunSpec, spec_b: RunSpec, div: Divergence,
             cause: str) -> tuple[str, dict[str, Any]]:
    """Replay the divergent step in both configurations with op capture (eagerly first when the
    configurations are the same) and name the first divergent op, its module and source."""
    same_config = spec_a.compile_mode == spec_b.compile_mode
    replay_a = checker.replay(spec_a, div.step, "a", eager=same_config, rank=div.rank)
    replay_b = checker.replay(spec_b, div.step, "b", eager=same_config, rank=div.rank)
    if replay_a is None or replay_b is None:
        return cause, {"localisation": "the replay did not reach the divergent step"}
    found = compare_replays(replay_a["ops"], replay_b["ops"])
    if found is None:
        where = "inside compiled code (the eager replays agree)" if same_config else "not reproduced in replay"
        return ("nondeterministic_op" if same_config and cause == "unknown" else cause), {"localisation": where}
    kind = found.pop("kind")
    new_cause = cause if cause == "init_params" else {"rng": "rng", "nondeterministic_op": "nondeterministic_op"}.get(
        kind, cause)
    return new_cause, {"localisation": kind, **found}


def localize_graph(checker: Checker, spec: RunSpec, div: Divergence) -> dict[str, Any]:
    """Replay the divergent step compiled, checking each compiled graph against its eager FX
    graph: names the first graph (compile id) whose outputs differ, the output and its FX node."""
    replay = checker.replay(spec, div.step, "graphs", graphs=True, rank=div.rank)
    if replay is None:
        return {"localisation": "the replay did not reach the divergent step"}
    graphs = replay.get("graphs", [])
    first = next((g for g in graphs if "first_differing_output" in g), None)
    if first is None:
        return {"localisation": f"the {len(graphs)} compiled graph call(s) of step {div.step} match their eager "
                                "FX graphs in the forward pass (the difference arises in backward)"}
    origin = (first.get("depends_on_random") or [first])[0]  # a random op the output depends on, else the output
    evidence = {"localisation": "compiled_graph", "compile_id": first["compile_id"],
                "output": f"output {first['first_differing_output']} ({first.get('target')}, FX node "
                          f"{first.get('node')})", "output_max_abs": first.get("max_abs"),
                "op": f"{origin.get('target')} (FX node {origin.get('node')}, compiled graph {first['compile_id']})",
                "module": origin.get("module"), "source": origin.get("source")}
    if first.get("depends_on_random"):
        evidence["random_nodes"] = first["depends_on_random"]
    return evidence


def _decomposition(checker: Checker, runs: dict[str, tuple[RunSpec, Run]], against: str) -> dict[str, Any] | None:
    """With inductor: eager, as written, and fallback_random=True separate RNG from numerics."""
    third = RunSpec("eager", "eager", "compilation disabled") if against == "fallback-random" else RunSpec(
        "fallback-random", "fallback-random", "fallback_random=True")
    run, _ = checker.run(third)
    runs[third.label] = (third, run)
    eager, fallback, compiled = (runs[k][1] for k in ("eager", "fallback-random", "compiled"))
    pairs = {"rng": (fallback, compiled), "numerics": (eager, fallback), "total": (eager, compiled)}
    out = {}
    for name, (x, y) in pairs.items():
        curve = divergence_curve(_snaps(x), _snaps(y), x.logs[0], y.logs[0])
        div, _ = first_divergence(x.logs, y.logs, Tolerance())  # bit for bit
        out[name] = {"between": [x.path.name, y.path.name], "bit_exact": div is None,
                     "final_max_abs": curve[-1]["max_abs"] if curve else None,
                     "final_max_rel": curve[-1]["max_rel"] if curve else None}
    return out


def _cause_from_decomposition(dec: dict[str, Any], against: str) -> tuple[str, dict[str, Any]]:
    rng, numerics = dec["rng"], dec["numerics"]
    if against == "fallback-random" or (not rng["bit_exact"] and (
            numerics["bit_exact"] or (rng["final_max_abs"] or 0) > 10 * (numerics["final_max_abs"] or 0))):
        because = ("with fallback_random=True the compiled run matches eager bit for bit" if numerics["bit_exact"]
                   else f"fallback_random=True removes most of the difference; {_fmt(numerics['final_max_abs'])} "
                        "remains (numerics)")
        if against == "fallback-random":
            because = "the runs differ only in inductor's RNG implementation (fallback_random)"
        return "rng", {"because": because, "remaining_numerics": numerics}
    return "numerics", {"because": "fallback_random=True does not remove the difference: rounding, not RNG",
                        "magnitude": numerics}


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def compare(run_a: Run, run_b: Run, tol: Tolerance) -> tuple[Divergence | None, bool, list[str]]:
    """The first divergence beyond ``tol``, whether the runs differ at all (bit for bit) while
    staying within it, and notes. Parameters are held to ``tol`` on the final snapshot."""
    notes = [f"ranks {run_a.ranks} vs {run_b.ranks}"] if run_a.ranks != run_b.ranks else []
    exact, more = first_divergence(run_a.logs, run_b.logs, Tolerance())
    if exact is None or tol.exact:
        return exact, False, notes + more
    tolerant, _ = first_divergence(run_a.logs, run_b.logs, tol)
    if tolerant is None:
        if _snaps(run_a).is_dir() and _snaps(run_b).is_dir():
            if not final_within([], tol, _snaps(run_a), _snaps(run_b)):
                tolerant = exact
        else:
            more.append("no parameter snapshots: only losses and gradient norms were held to the tolerance")
    return tolerant, tolerant is None, notes + more


def _largest_difference(curve: list[dict[str, Any]], run_a: Run, run_b: Run) -> dict[str, Any]:
    """The largest parameter (from snapshots) and loss (from every step) differences seen."""
    losses_b = {(log.rank, s.index): s.loss for log in run_b.logs for s in log.of(Step)}
    loss = [abs(s.loss - losses_b[(log.rank, s.index)]) for log in run_a.logs for s in log.of(Step)
            if s.loss is not None and losses_b.get((log.rank, s.index)) is not None]
    return {"params_max_abs": max((c["max_abs"] for c in curve), default=None),
            "loss_max_abs": max(loss, default=None)}


def determinism_section(div: Divergence | None, within: bool, cause: str | None, evidence: dict[str, Any],
                        labels: list[str], run_a: Run, run_b: Run, notes: list[str], snapshots: bool,
                        endings: list[Ending], tol: Tolerance, unreadable_exit: int) -> dict[str, Any]:
    """The report's ``determinism`` section for one pair of runs, its verdict earned from what was
    compared and from how every run ended (:mod:`torchrepro.analysis.verdict`)."""
    curve = divergence_curve(_snaps(run_a), _snaps(run_b), run_a.logs[0], run_b.logs[0]) if snapshots else []
    compared = steps_compared(run_a.logs, run_b.logs)
    verdict, exit_code = judge(div is not None, within, compared, endings, unreadable_exit)
    first = None
    if div is not None:
        module = evidence.pop("module", None) or div.detail.get("module") if div.what == "init_params" else (
            evidence.pop("module", None) or _module_of_parameter(div.detail.get("first_parameter")))
        first = {"step": div.step, "rank": div.rank, "what": div.what, "module": module,
                 "op": evidence.pop("op", None), "source": evidence.pop("source", None),
                 "phase": evidence.pop("phase", None), "cause": cause, "detail": div.detail, "evidence": evidence}
        first |= {k: evidence[k] for k in LOCALISATION_KEYS if evidence.get(k) is not None}
        if div.what == "init_params":
            first["before_step"] = 0
    env = environment_differences(run_a.logs[0].header, run_b.logs[0].header) if run_a.logs and run_b.logs else []
    det = {"verdict": verdict, "exit_code": exit_code, "runs": labels, "first_divergence": first, "curve": curve,
           "notes": notes, "rtol": tol.rtol, "atol": tol.atol, "steps_compared": compared,
           "endings": [e.to_json() for e in endings], "environment_differences": env,
           "step_clock": _step_clock(run_a)}
    if verdict == "nothing_compared":
        det["nothing_compared_because"] = nothing_compared_because(endings)
    if verdict == "within_tolerance":
        det["largest_difference"] = _largest_difference(curve, run_a, run_b)
    if env and div is None:
        notes.append("the environments differ (" + "; ".join(env[:3]) + "), yet the compared steps agree")
    return det


def _step_clock(run: Run) -> str | None:
    """What ended each step: ``optimizer.step()`` or ``backward()`` (no optimizer)."""
    return next((c.note for log in run.logs for c in log.events if getattr(c, "name", None) == "step_clock"), None)


def _hint_key(cause: str, against: str | None, run: Run, evidence: dict[str, Any] | None = None) -> str:
    if cause == "rng" and against:
        return "rng_compiled"
    if cause == "nondeterministic_op" and (evidence or {}).get("kernel_atomic_add"):
        return "nondeterministic_kernel"
    if cause == "nondeterministic_op" and any(settings(log).get("deterministic_algorithms") for log in run.logs):
        return "nondeterministic_op_deterministic_on"  # the usual fix was already in force
    return cause


def _findings(det: dict[str, Any], hint_key: str | None) -> list[Finding]:
    fd = det["first_divergence"]
    out = [Finding("RUN_DID_NOT_END_NORMALLY", "error", f"{e['run']} did not end normally: {'; '.join(e['problems'])}",
                   hint="The steps it recorded were compared; the verdict cannot cover the whole run. Fix the failure "
                        "(its stderr is in the run's run.json) and check again.", evidence=e)
           for e in det["endings"] if not e["ended_normally"]]
    if det["verdict"] == "diverged" and fd is not None:
        hint = CAUSE_HINTS[hint_key or fd["cause"]]
        if det.get("fixes"):  # measured: recommend only what was tried and bit-exact
            why = hint if hint_key == "nondeterministic_kernel" else ""
            hint = " ".join(filter(None, [fix_hint(det["fixes"]), why]))
        out.insert(0, Finding(f"DIVERGED_{fd['cause'].upper()}", "error", verdict_line(det),
                              hint=hint,
                              evidence={k: v for k, v in fd.items() if k != "evidence"} | {"evidence": fd["evidence"]}))
    return out


def check(script: Path, args: list[str], *, runs: int = 2, seed: int | None = None, against: str | None = None,
          out: Path | None = None, tolerance: Tolerance | None = None, localize_divergence: bool = True,
          console: Console | None = None, nproc: int = 1, timeout: float | None = None,
          env: dict[str, str] | None = None, fixes: bool | None = None,
          only_fixes: list[str] | None = None) -> tuple[CheckReport, Path]:
    """Run, compare, explain; returns the report (also written to ``OUT/report.json``). After a
    divergence the fix ladder runs (``fixes=None``: for causes a fix can address; True: always;
    False: never), limited to ``only_fixes`` when given."""
    from .fix_ladder import backend_stages, localize_kernels, run_fix_ladder

    console = console or Console(stderr=True)
    tol = tolerance or Tolerance()
    script = validate_script(script)
    if runs < 2 and against is None:
        raise InputError("--runs must be at least 2 (there is nothing to compare with one run)")
    out = create_run_dir(out or default_run_dir(script, label="check"))
    snapshots = against is not None or not tol.exact
    checker = Checker(script, args, out, seed=seed, snapshots=snapshots, console=console, nproc=nproc,
                      timeout=timeout, env=env)
    specs = plan_runs(runs, against)
    done = {spec.label: (spec, checker.run(spec)[0]) for spec in specs}
    (spec_a, run_a), (spec_b, run_b) = done[specs[0].label], done[specs[-1].label]
    pairs = [(done[specs[0].label], done[s.label]) for s in specs[1:]]
    div, within, notes, pair = None, False, [], pairs[0]
    for (sa, ra), (sb, rb) in pairs:  # the earliest divergence over all pairs with the first run
        compare_lengths(checker.endings[sa.label], checker.endings[sb.label])
        d, w, n = compare(ra, rb, tol)
        notes += n
        within = within or w
        if d is not None and (div is None or (d.step, d.rank) < (div.step, div.rank)):
            div, pair = d, ((sa, ra), (sb, rb))
    (spec_a, run_a), (spec_b, run_b) = pair
    cause, evidence, decomposition = None, {}, None
    if div is not None:
        cause, evidence = decide(div, run_a, run_b, same_config=spec_a.compile_mode == spec_b.compile_mode)
        if against is not None and cause == "unknown":
            if _uses_inductor(run_b):
                decomposition = _decomposition(checker, done, against)
                cause, evidence = _cause_from_decomposition(decomposition, against)
                if localize_divergence:
                    evidence.update(localize_graph(checker, spec_b, div))
            else:
                cause, evidence = "numerics", {"because": "compiled without inductor RNG: the difference is rounding"}
        kernels = None
        if localize_divergence and against is None and cause == "unknown" and _uses_inductor(run_a):
            kernels = localize_kernels(checker, spec_a, spec_b, div)
            if kernels is not None:
                cause, evidence = "nondeterministic_op", {**evidence, **kernels}
        if kernels is None and localize_divergence and (
                cause in ("unknown", "init_params") or against is None and cause == "numerics"):
            cause, more = localize(checker, spec_a, spec_b, div, cause)
            evidence.update(more)
    ladder, stages = [], None
    if div is not None and fixes is not False and against is None and (fixes or cause in FIXABLE):
        ladder = run_fix_ladder(checker, spec_b, div, cause, dict(evidence), [run_a, run_b], only_fixes)
    if decomposition is not None and against == "eager" and fixes is not False:
        stages = backend_stages(checker, done)
    det = determinism_section(div, within, cause, evidence, [s.label for s in specs], run_a, run_b, notes, snapshots,
                              [checker.endings[s.label] for s in specs], tol, unreadable_exit=3)
    if decomposition is not None:
        det["decomposition"] = decomposition
    if ladder:
        det["fixes"], det["fix_recommended"] = ladder, recommend(ladder)
    if stages is not None:
        det["backend_stages"] = stages
    det["against"] = against
    same_config = [(sa.label, ra, sb.label, rb) for (sa, ra), (sb, rb) in pairs if sa.compile_mode == sb.compile_mode]
    report = _report(det, _hint_key(cause, against, run_b, evidence) if cause else None, {
        s.label: str(out / s.label) for s in specs} | (
        {"decomposition": str(out / list(done)[-1])} if decomposition else {}), checker.timings,
        {**launch_meta(script), "script": str(script), "args": args, "seed": seed, "runs": runs, "against": against},
        [f for pair in same_config for f in cache_key_findings(*pair)], (run_a, run_b))
    write_report(out, report)
    return report, out


def cache_key_findings(label_a: str, run_a: Run, label_b: str, run_b: Run) -> list[Finding]:
    """Compile-cache lookups of run B that could not reuse run A's entries: which key component differs."""
    ranks_b = {log.rank: log for log in run_b.logs}
    return [f for log_a in run_a.logs if log_a.rank in ranks_b
            for f in key_findings(log_a.of(CacheLookup), ranks_b[log_a.rank].of(CacheLookup),
                                  f"{label_a} rank {log_a.rank}", f"{label_b} rank {log_a.rank}")]


def _report(det: dict[str, Any], hint_key: str | None, run_dirs: dict[str, str], timings: dict[str, float],
            meta: dict[str, Any], extra: list[Finding] = (), compared: tuple[Run, Run] | None = None) -> CheckReport:
    line = verdict_line(det)
    best = det.get("fix_recommended")
    if best:
        ratio = f", {best['step_time_ratio']:.2f}x step time" if best.get("step_time_ratio") else ""
        line += f"; measured fix: {best['name']} (bit-exact{ratio})"
    first_change = (det.get("backend_stages") or {}).get("first_change")
    if first_change:
        line += f"; results first change at {first_change['stage']} (vs {first_change['previous']})"
    report = CheckReport(CheckRun(run_dirs, timings, meta), Determinism.from_json(det),
                         _findings(det, hint_key) + list(extra), line)
    if compared:  # the two runs side by side (the HTML report draws them)
        a, b = compared
        report.provenance = provenance({**a.meta, **meta}, a.logs[0].header)
        report.sides = [side(label, str(r.path), r.meta, r.logs) for label, r in zip(det["runs"], compared)]
        rank = (det["first_divergence"] or {}).get("rank", a.logs[0].rank)
        log_a = next((log for log in a.logs if log.rank == rank), a.logs[0])
        log_b = next((log for log in b.logs if log.rank == log_a.rank), b.logs[0])
        report.step_comparison = step_comparison(log_a, log_b)
    return report


def _script_of(run: Run) -> str | None:
    """The file name of the script a run ran, as its run.json says."""
    script = run.meta.get("script")
    return Path(str(script)).name if script else None


def diff(path_a: Path, path_b: Path, tolerance: Tolerance | None = None) -> CheckReport:
    """Compare two stored runs (no replay: the evidence in their logs and snapshots)."""
    tol = tolerance or Tolerance()
    run_a, run_b = load_run(path_a), load_run(path_b)
    scripts = [_script_of(r) for r in (run_a, run_b)]
    if None not in scripts and scripts[0] != scripts[1]:
        raise InputError(f"{path_a} is a run of {scripts[0]}, {path_b} of {scripts[1]}: diff compares two runs of "
                         "one script")
    endings = [ending(str(path_a), run_a.meta, run_a.logs), ending(str(path_b), run_b.meta, run_b.logs)]
    compare_lengths(*endings)
    div, within, notes = compare(run_a, run_b, tol)
    notes = run_a.problems + run_b.problems + notes
    cause, evidence = decide(div, run_a, run_b) if div is not None else (None, {})
    if div is not None and cause == "unknown":
        modes = [r.meta.get("compile_mode") for r in (run_a, run_b)]
        if modes[0] != modes[1]:
            cause, evidence = "numerics", {"because": f"compile modes differ ({modes[0]} vs {modes[1]})"}
    snapshots = _snaps(run_a).is_dir() and _snaps(run_b).is_dir()
    det = determinism_section(div, within, cause, evidence, [str(path_a), str(path_b)], run_a, run_b, notes, snapshots,
                              endings, tol, unreadable_exit=2)
    return _report(det, _hint_key(cause, None, run_b) if cause else None, {"a": str(path_a), "b": str(path_b)}, {},
                   {**launch_meta(None), "diff": [str(path_a), str(path_b)]},
                   cache_key_findings("A", run_a, "B", run_b), (run_a, run_b))


RESUME_HINTS = {
    "data_order": "The resumed run sees other batches: restore the sampler epoch (sampler.set_epoch) and skip the "
                  "batches already consumed (resume.apply(batches) right after iter(loader)).",
    "rng": "An RNG state was not restored, or restored before the DataLoader iterator drew its seed: save with "
           "torchrepro.checkpoint.save and restore with resume.apply(batches) after iter(loader).",
    "unknown": "Same batches and RNG, different results: the model or optimizer state (moments, step counts, LR "
               "scheduler, gradient scaler, buffers) is not fully saved and loaded.",
}


def check_resume(script: Path, args: list[str], *, at: int, seed: int | None = None, out: Path | None = None,
                 nproc: int = 1, timeout: float | None = None, env: dict[str, str] | None = None,
                 console: Console | None = None) -> tuple[CheckReport, Path]:
    """Run to the end; run again stopping after step ``at`` with a checkpoint; resume from it in a
    fresh process; compare every step after ``at`` and the final parameters bit for bit."""
    from .checkpoint import ENV_RESUME_FROM, ENV_SAVE_TO, ENV_STOP_AT

    console = console or Console(stderr=True)
    script = validate_script(script)
    if at < 1:
        raise InputError("--at must be at least 1 (the step after which to stop and resume)")
    out = create_run_dir(out or default_run_dir(script, label="resume"))
    checker = Checker(script, args, out, seed=seed, snapshots=False,
                      console=console, nproc=nproc, timeout=timeout, env=env)
    full, _ = checker.run(RunSpec("full", None, "to the end"))
    steps = min((len(log.of(Step)) for log in full.logs), default=0)
    if at >= steps and checker.endings["full"].ok:
        raise InputError(f"--at {at}: the run has {steps} step(s), so nothing would run after the checkpoint; "
                         f"choose --at below {steps}")
    saved = out / "checkpoint"
    stopped, _ = checker.run(RunSpec("stopped", None, f"stopping after step {at}"),
                             env={ENV_STOP_AT: str(at), ENV_SAVE_TO: str(saved)})
    if not list(saved.glob("position-rank*.json")):
        raise InputError(f"the script saved no checkpoint after step {at}: it must call torchrepro.checkpoint.save() "
                         "when checkpoint.plan().should_stop(step) (see examples/resume_ddp.py)")
    resumed, _ = checker.run(RunSpec("resumed", None, f"resumed after step {at}"), env={ENV_RESUME_FROM: str(saved)})
    div, _, notes = compare(full, resumed, Tolerance())
    notes = [n for n in notes if "with the same index" not in n]  # a resumed run has only the later steps
    before, _, _ = compare(full, stopped, Tolerance())
    if before is not None:
        notes.append(f"the run is not reproducible before the checkpoint (step {before.step} differs between two "
                     "runs): fix that first (torchrepro check)")
    first_resumed = min((s.index for log in resumed.logs for s in log.of(Step)), default=None)
    if first_resumed != at:
        notes.append(f"the resumed run's first step is numbered {first_resumed}, expected {at}: call "
                     "resume.apply(...) (it aligns the step numbers)")
    last = {log.rank: log.of(Step)[-1].index for log in full.logs if log.of(Step)}
    last_resumed = {log.rank: log.of(Step)[-1].index for log in resumed.logs if log.of(Step)}
    if div is None and last != last_resumed:
        checker.endings["resumed"].problems.append(f"the resumed run ended at step {last_resumed}, the full run at "
                                                   f"{last}")
    cause, evidence = (None, {})
    if div is not None:
        cause, evidence = decide(div, full, resumed)
        evidence["hint"] = RESUME_HINTS.get(cause, RESUME_HINTS["unknown"])
    det = determinism_section(div, False, cause, evidence, ["full", "resumed"], full, resumed, notes, False,
                              list(checker.endings.values()), Tolerance(), unreadable_exit=3)
    det["resume_at"] = at
    report = _report(det, None, {"full": str(out / "full"), "stopped": str(out / "stopped"),
                                 "resumed": str(out / "resumed"), "checkpoint": str(saved)}, checker.timings,
                     {**launch_meta(script), "script": str(script), "args": args, "seed": seed,
                      "resume_at": at, "nproc": nproc}, compared=(full, resumed))
    if det["verdict"] == "bit_exact":
        report.verdict_line = (f"BIT-EXACT RESUME: stopping after step {at} and resuming in a fresh process gives "
                               f"the same {det['steps_compared']} steps and final parameters")
    elif div is not None:
        report.findings[0].hint = evidence["hint"]
    write_report(out, report)
    return report, out

