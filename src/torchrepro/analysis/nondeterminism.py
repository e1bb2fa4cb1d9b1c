"""Why two runs diverged: the cause of the first divergence decided from evidence, its hint, and
the report's ``determinism`` section. Pure: event logs, recorded replays and the parameter
difference curve in, a decision out; nothing here imports torch, launches a process or reads a
file (:mod:`torchrepro.commands.check.comparison` runs the scripts and replays, reads the snapshots and calls in).

The evidence is weighed in the order a step happens: the initial parameters, the batch, the RNG
state the step ran with, the runs' environments, the graphs they compiled; what the step-level
evidence cannot decide (``unknown``) is decided by what runs beyond the two show: eager, compiled
and ``fallback_random`` runs side by side (``--against``), repeated compiled graphs, op-level replays.

>>> from torchrepro.analysis.divergence import Divergence
>>> decide(Divergence(3, 0, "batch"), [], [])
('data_order', {'because': 'the batches of step 3 differ'})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import Capability, Compile, GraphProbe, InitParams, Step
from .divergence import (
    SKETCH_CONFIDENCE,
    Divergence,
    Tolerance,
    compare_replays,
    compile_differences,
    coverage,
    distance,
    environment_differences,
    first_divergence,
    settings,
    sketch_error,
    steps_compared,
)
from ..eventlog.payloads import JsonObject
from ..reports.check_report import CurvePoint, FirstDivergence, LocalisationKey
from ..reports.findings import Finding
from .fix_ranking import fix_hint
from .nonfinite import UNINITIALISED_HINT
from .rank_groups import ranks_label
from .verdict import Ending, judge, nothing_compared_because, verdict_line

Decision = tuple[str, JsonObject]  # (cause, its evidence: what shows it, per cause)

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
    "init_params_uninitialised": "The parameters differ before the first step because some were never "
    "initialised (UNINITIALISED_PARAMETERS names them): their memory holds whatever it held before, another "
    "thing in every run. " + UNINITIALISED_HINT,
    "environment": "The runs' environments differ (thread counts, versions, TF32, determinism switches): pin them.",
    "recompile": "The runs compiled different graphs: run torchrepro doctor on each to see why.",
    "shared_files": "A run read a file an earlier run wrote in the working directory (a checkpoint the script "
    "resumes from when it is there): the runs did not start from the same files, whatever else differs. Remove "
    "the file before each run (or give the script a fresh checkpoint path per run), or let torchrepro run each "
    "run in a fresh copy of the working directory: leave TORCHREPRO_WORKDIR unset and run from a directory of at "
    "most 256 MiB, passing larger data by absolute path (docs/workdir.md).",
    "unknown": "No evidence points to one cause; rerun with more runs (--runs 3) to see if it repeats.",
    "unknown_diff": "No evidence in the two stored runs points to one cause: torchrepro check SCRIPT runs the "
    "script again with every piece of evidence recorded and localises the divergence.",
}


LOCALISATION_KEYS: tuple[LocalisationKey, ...] = (
    "compile_id",
    "graph",
    "parameter",
    "output",
    "node",
    "kernel",
    "kernel_fuses",
)
FIXABLE = ("nondeterministic_op", "numerics", "unknown")  # causes the fix ladder runs for unasked


def uses_inductor(logs: list[EventLog]) -> bool:
    """Whether any compile of these logs went through inductor (timed or looked up in its cache)."""
    return any(c.inductor_s is not None or c.cache.get("fxgraph") for log in logs for c in log.of(Compile))


def compare(
    logs_a: list[EventLog], logs_b: list[EventLog], tol: Tolerance, params_within: Callable[[], bool] | None = None
) -> tuple[Divergence | None, bool, list[str]]:
    """The first divergence beyond ``tol``, whether the runs differ at all (bit for bit) while
    staying within it, and notes. ``params_within`` says whether the final parameters are within
    ``tol`` (from the runs' last common snapshot; None: the runs have no snapshots)."""
    ranks_a, ranks_b = [log.rank for log in logs_a], [log.rank for log in logs_b]
    notes = [f"{ranks_label(ranks_a)} vs {ranks_label(ranks_b)}"] if ranks_a != ranks_b else []
    exact, more = first_divergence(logs_a, logs_b, Tolerance())
    if exact is None or tol.exact:
        return exact, False, notes + more
    tolerant, _ = first_divergence(logs_a, logs_b, tol)
    if tolerant is None:
        if params_within is None:
            more.append("no parameter snapshots: only losses and gradient norms were held to the tolerance")
        elif not params_within():
            tolerant = exact
    return tolerant, tolerant is None, notes + more


def shared_files(crossings: list[tuple[str, str, str]]) -> Decision:
    """The cause when a run read a file an earlier run wrote in the shared working directory
    (``crossings``: each file, the run that wrote it, the run that read it): named before anything
    else is blamed, since the runs did not start from the same files.

    >>> shared_files([("snapshot.pt", "run-1", "run-2")])[1]["because"]
    'run-1 wrote snapshot.pt in the working directory, run-2 read it'
    """
    path, wrote, read = crossings[0]
    more = f" (and {len(crossings) - 1} more file(s))" if len(crossings) > 1 else ""
    return "shared_files", {
        "because": f"{wrote} wrote {path} in the working directory, {read} read it{more}",
        "files": [{"path": p, "written_by": w, "read_by": r} for p, w, r in crossings[:20]],
    }


def decide(div: Divergence, logs_a: list[EventLog], logs_b: list[EventLog], same_config: bool = True) -> Decision:
    """The cause that step-level evidence proves, or ``unknown`` (then localisation decides).
    Runs of different compile configurations are expected to compile differently."""
    if div.what == "init_params":
        return "init_params", {
            "because": "the parameters differ before the first forward "
            f"({div.detail.get('parameters_differing')} tensor(s), first "
            f"{div.detail.get('first_parameter')})"
        }
    if div.what == "batch":
        return "data_order", {"because": f"the batches of step {div.step} differ"}
    # Read at backward(), the state already reflects the forward pass: between different compile
    # configurations that is a consequence (inductor draws its seed from the global generator).
    if div.what == "rng" and (same_config or div.detail.get("read_at") != "backward"):
        at = {"batch": "when its first batch was fetched", "backward": "at its first backward()"}.get(
            div.detail.get("read_at", ""), "at its start"
        )
        return "rng", {
            "because": f"the torch RNG state of step {div.step} differs ({at}): "
            + ", ".join(div.detail.get("streams") or []),
            "streams": div.detail.get("streams"),
        }
    # a configuration's own switch (fallback_random) is not an environment difference
    env = environment_differences(
        logs_a[0].header, logs_b[0].header, ignore=() if same_config else ("fallback_random",)
    )
    if env:
        return "environment", {"because": "the runs' environments differ", "differences": env}
    graphs = [d for la, lb in zip(logs_a, logs_b) for d in compile_differences(la, lb)] if same_config else []
    if graphs:
        return "recompile", {"because": "the runs compiled different graphs", "differences": graphs}
    return "unknown", {}


def numerics_without_inductor() -> Decision:
    """Eager against a compiled run that used no inductor graph: no inductor RNG to blame."""
    return "numerics", {"because": "compiled without inductor RNG: the difference is rounding"}


def numerics_of_modes(mode_a: str | None, mode_b: str | None) -> Decision | None:
    """Two stored runs of different compile modes with no step-level cause: rounding (None when
    the modes are the same)."""
    if mode_a == mode_b:
        return None
    return "numerics", {"because": f"compile modes differ ({mode_a} vs {mode_b})"}


def cause_from_decomposition(dec: JsonObject, against: str) -> Decision:
    """Eager, compiled and ``fallback_random=True`` compared pairwise (``dec``: ``rng`` between
    fallback and compiled, ``numerics`` between eager and fallback): ``rng`` when inductor's RNG
    accounts for (most of) the difference, else ``numerics``. When the run as written is not
    itself reproducible up to where the ``rng`` part first differs (``run_to_run``: two runs as
    written), that part is no evidence of RNG: the compiled code's own nondeterminism, which
    bounds the split, is the cause (``nondeterministic_op``).

    >>> same = {"bit_exact": True, "final_max_abs": 0.0}
    >>> apart = {"bit_exact": False, "final_max_abs": 0.01, "between": ["compiled", "compiled-again"]}
    >>> cause_from_decomposition({"rng": apart, "numerics": same, "run_to_run": apart}, "eager")[0]
    'nondeterministic_op'
    """
    rng, numerics, again = dec["rng"], dec["numerics"], dec.get("run_to_run")
    if against != "fallback-random" and again is not None and not again["bit_exact"]:
        return "nondeterministic_op", {
            "because": "the compiled run is not reproducible run to run: two runs as written differ (by "
            f"{_fmt(again['final_max_abs'])} in parameters) by the step at which fallback_random=True and the run "
            f"as written first differ, so that difference ({_fmt(rng['final_max_abs'])}) is the compiled code's own "
            "nondeterminism, not its RNG; only what exceeds it could be RNG",
            "run_to_run": again,
            "remaining_numerics": numerics,
        }
    if against == "fallback-random" or (
        not rng["bit_exact"]
        and (numerics["bit_exact"] or (rng["final_max_abs"] or 0) > 10 * (numerics["final_max_abs"] or 0))
    ):
        because = (
            "with fallback_random=True the compiled run matches eager bit for bit"
            if numerics["bit_exact"]
            else f"fallback_random=True removes most of the difference; {_fmt(numerics['final_max_abs'])} "
            "remains (numerics)"
        )
        if against == "fallback-random":
            because = "the runs differ only in inductor's RNG implementation (fallback_random)"
        return "rng", {"because": because, "remaining_numerics": numerics}
    return "numerics", {
        "because": "fallback_random=True does not remove the difference: rounding, not RNG",
        "magnitude": numerics,
    }


def cause_from_kernels(evidence: JsonObject, kernels: JsonObject) -> Decision:
    """A compiled graph's output differs on identical inputs (``kernels``, from the kernel replays):
    the op is nondeterministic."""
    return "nondeterministic_op", {**evidence, **kernels}


def graph_probes(runs: dict[str, list[EventLog]]) -> list[JsonObject]:
    """Every compiled graph the runs probed (``capture.graph_probe``: called again on copies of the
    inputs of its first call, in the run's own process), by run: the report's ``graph_probes``."""
    return [
        {
            "run": label,
            "rank": log.rank,
            "step": p.step,
            "compile_id": p.compile_id,
            "graph": p.graph,
            "repeats": p.repeats,
            "runs_differing": p.runs_differing,
            "threads": p.threads,
            "differing": p.differing,
            "max_abs": p.max_abs,
            "explained": p.explained,
            "eager_differing": p.eager_differing,
            "eager_explained": p.eager_explained,
            "one_thread": p.one_thread,
            "accumulates": p.accumulates,
            "time_s": p.time_s,
            "error": p.error,
            "not_saved": p.not_saved,
        }
        for label, logs in runs.items()
        for log in logs
        for p in log.of(GraphProbe)
    ]


def probe_divergence(probes: list[JsonObject]) -> tuple[Divergence, str, JsonObject] | None:
    """The earliest probed graph (by step, then rank) whose outputs were not bit for bit the same
    on identical inputs: a divergence within one run, its cause (``nondeterministic_op``, as the
    kernel replays conclude) and evidence naming the graph, output, node, kernel and source line.
    None when every probed graph repeated bit for bit."""
    found = sorted(
        (p for p in probes if p["differing"]),
        key=lambda p: (p["step"] if p["step"] is not None else 1 << 30, p["rank"]),
    )
    if not found:
        return None
    p = found[0]
    named = dict(p["explained"] or {})
    what = f"gradient of {named['parameter']}" if named.get("parameter") else f"output {min(p['differing'])}"
    because = (
        f"compiled graph {p['compile_id']} ({p['graph']}) of {p['run']}: {what} differs when called again on "
        f"identical inputs in the run's own process ({p['runs_differing']} of {p['repeats']} repeats at "
        f"{p['threads']} thread(s)" + (f", by up to {p['max_abs']:.3g}" if p["max_abs"] is not None else "") + ")"
    )
    evidence: JsonObject = {
        "named_by": "graph_probe",
        "because": because,
        "probe": {k: p[k] for k in ("run", "repeats", "runs_differing", "threads", "differing", "max_abs")},
        "thread_dependence": {
            "threads": p["threads"],
            "repeats": p["repeats"],
            "repeats_differ": True,
            "one_thread": p.get("one_thread"),
        },
    }
    for key in (*LOCALISATION_KEYS, "op", "source", "module", "kernel_atomic_add", "accumulating_node", "eager_node"):
        if named.get(key) is not None:
            evidence[key] = named[key]
    evidence.setdefault("compile_id", p["compile_id"])
    evidence.setdefault("graph", p["graph"])
    step = p["step"] if p["step"] is not None else 0
    detail = {"run": p["run"], "compile_id": p["compile_id"], "graph": p["graph"]}
    return Divergence(step, p["rank"], "compiled_graph", detail), "nondeterministic_op", evidence


def name_the_race(evidence: JsonObject, race: JsonObject) -> JsonObject:
    """``check --against``: the compiled run is not reproducible run to run (cause
    ``nondeterministic_op``) and its own probe found the graph that is not (``race``, the evidence of
    :func:`probe_divergence`): that graph, its op, kernel and source line are what the evidence
    names, beside why the cause was decided; where compiled first departs from eager (the graph
    replay's localisation) is kept under ``against_eager``.

    >>> found = {"because": "graph 0/1 differs", "named_by": "graph_probe", "graph": "backward", "op": "aten.add"}
    >>> named = name_the_race({"because": "not reproducible", "op": "aten.mm", "localisation": "compiled_graph"}, found)
    >>> named["op"], named["graph"], named["against_eager"], named["because"]
    ('aten.add', 'backward', {'op': 'aten.mm', 'localisation': 'compiled_graph'}, 'not reproducible; graph 0/1 differs')
    """
    replaced = ("localisation", "compile_id", "output", "output_max_abs", "first_differing", "random_nodes")
    against = {k: v for k, v in evidence.items() if k in (*replaced, *LOCALISATION_KEYS, "op", "module", "source")}
    kept = {k: v for k, v in evidence.items() if k not in against}
    because = "; ".join(filter(None, [kept.pop("because", None), race.get("because")]))
    return {**kept, **{k: v for k, v in race.items() if k != "because"}, "because": because, "against_eager": against}


def not_localised(cause: str | None, why: str) -> JsonObject:
    """Evidence when localisation itself failed: why (an exception's first line, or a replay that
    ended early), and what was still concluded without it."""
    return {
        "localisation": "not_localised",
        "localisation_failed": why,
        "localisation_note": f"localisation failed ({why}); still concluded from the step records: "
        f"cause {cause or 'unknown'}",
    }


def cause_from_replays(
    cause: str,
    replay_a: JsonObject | None,
    replay_b: JsonObject | None,
    same_config: bool,
    failure: str | None = None,
) -> Decision:
    """The divergent step replayed in both runs with op capture (eagerly when the configurations
    are the same): the first divergent op, its module and source, and what it says about ``cause``.
    Eager replays that agree put a same-configuration divergence inside compiled code. A replay
    without a record leaves the cause as it was, with ``failure`` (why) in the evidence."""
    if replay_a is None or replay_b is None:
        return cause, not_localised(cause, failure or "a replay wrote no record")
    found = compare_replays(replay_a["ops"], replay_b["ops"])
    if found is None:
        where = "inside compiled code (the eager replays agree)" if same_config else "not reproduced in replay"
        return ("nondeterministic_op" if same_config and cause == "unknown" else cause), {"localisation": where}
    kind = found.pop("kind")
    new_cause = (
        cause
        if cause == "init_params"
        else {"rng": "rng", "nondeterministic_op": "nondeterministic_op"}.get(kind, cause)
    )
    return new_cause, {"localisation": kind, **found}


def graph_evidence(
    replay: JsonObject | None,
    step: int,
    cause: str | None = None,
    failure: str | None = None,
    probes: list[JsonObject] | None = None,
) -> JsonObject:
    """The divergent step replayed compiled, each compiled graph checked against its eager FX graph:
    the first graph (compile id) whose outputs differ, the output and its FX node; the op blamed
    agrees with ``cause``: the random op the output depends on when the cause is ``rng``, else
    the differing output's own node (an inert random op is not blamed for rounding). A replay
    without a record, or a graph the check failed on, is said, with what was still concluded.
    Where a forward graph differs, its probe names the op where it first departs from eager
    (:func:`first_forward_node`); where the forward graphs match, the compiled run's ``probes``
    (:func:`graph_probes`) name the first backward output that differs from the same FX graph run
    eagerly (:func:`backward_evidence`)."""
    if replay is None:
        return not_localised(cause, failure or "the graph replay wrote no record")
    graphs = replay.get("graphs", [])
    errors = [f"compiled graph {g['compile_id']}: {g['error']}" for g in graphs if "error" in g]
    first = next((g for g in graphs if "first_differing_output" in g), None)
    if first is None:
        if errors:
            return not_localised(cause, "; ".join(errors[:2]))
        forward = (
            f"the {len(graphs)} compiled graph call(s) of step {step} match their eager FX graphs in the forward pass"
        )
        return backward_evidence(forward, probes or []) or {
            "localisation": f"{forward} (the difference arises in backward)"
        }
    random = first.get("depends_on_random") or []
    origin = random[0] if cause == "rng" and random else first
    evidence = {
        "localisation": "compiled_graph",
        "compile_id": first["compile_id"],
        "output": f"output {first['first_differing_output']} ({first.get('target')}, FX node {first.get('node')})",
        "output_max_abs": first.get("max_abs"),
        "op": f"{origin.get('target')} (FX node {origin.get('node')}, compiled graph {first['compile_id']})",
        "module": origin.get("module"),
        "source": origin.get("source"),
    }
    if random:
        evidence["random_nodes"] = random
    if origin is first and (earliest := first_forward_node(probes or [], first["compile_id"])):
        evidence.update(earliest)  # rounding: where the graph first departs, not the output it reaches
    if errors:
        evidence["localisation_note"] = "checking some graphs failed: " + "; ".join(errors[:2])
    return evidence


def _unlike_eager(probes: list[JsonObject], graph: str, compile_id: str | None = None) -> JsonObject | None:
    """The first probe of a ``graph`` ("forward" or "backward"; of ``compile_id`` when given) whose
    outputs differed from the same FX graph run eagerly, or None."""
    return next(
        (
            p
            for p in probes
            if p["graph"] == graph and compile_id in (None, p["compile_id"]) and p.get("eager_differing")
        ),
        None,
    )


def first_forward_node(probes: list[JsonObject], compile_id: str) -> JsonObject | None:
    """Where compiled graph ``compile_id``'s forward first departs from the same FX graph run eagerly
    (the graph AOTAutograd made, on the same inputs, as a probe compared them): the earliest output
    in the graph's order that differs (a saved activation, such as the first LayerNorm's statistics,
    comes before the logits computed from it), as the op, module and source line the evidence names.
    None when no probe compared that forward graph with eager, or it matched."""
    named = (_unlike_eager(probes, "forward", compile_id) or {}).get("eager_explained") or {}
    if not named.get("node"):
        return None
    return {
        "op": f"{named.get('op')} (FX node {named['node']}, compiled graph {compile_id}, forward)",
        "module": named.get("module"),
        "source": named.get("source"),
        "first_differing": named.get("output"),
        **{k: named[k] for k in ("kernel", "kernel_fuses") if named.get(k) is not None},
    }


def backward_evidence(forward: str, probes: list[JsonObject]) -> JsonObject | None:
    """The first backward graph a probe found unlike its FX graph run eagerly (the graph AOTAutograd
    made, as aot_eager runs it), on the same inputs: the output (a parameter's gradient) computed
    first in the graph's order that differs, its node, op and source line. None when no probe
    compared a backward graph with eager, or every one matched."""
    found = _unlike_eager(probes, "backward")
    if found is None:
        return None
    named = found.get("eager_explained") or {}
    what = f"the gradient of {named['parameter']}" if named.get("parameter") else f"output {named.get('output_index')}"
    evidence: JsonObject = {
        "localisation": "backward_graph",
        "because": f"{forward}; in backward, compiled graph {found['compile_id']} differs from the same FX graph "
        f"run eagerly on the same inputs ({len(found['eager_differing'])} output(s)), first at {what}"
        + (f", by up to {named['max_abs']:.3g}" if named.get("max_abs") is not None else ""),
        "compile_id": found["compile_id"],
        "graph": "backward",
    }
    for key in ("parameter", "node", "op", "module", "source", "kernel", "kernel_fuses"):
        if named.get(key) is not None:
            evidence[key] = named[key]
    if named.get("output"):
        evidence["output"] = named["output"]
    return evidence


def hint_key(cause: str, against: str | None, logs: list[EventLog], evidence: JsonObject | None = None) -> str:
    """Which of :data:`CAUSE_HINTS` fits: the cause, made precise by what the runs show (inductor's
    RNG against eager, an atomic-add kernel, deterministic algorithms already on)."""
    if cause == "rng" and against:
        return "rng_compiled"
    if cause == "nondeterministic_op" and (evidence or {}).get("kernel_atomic_add"):
        return "nondeterministic_kernel"
    if cause == "nondeterministic_op" and any(settings(log).get("deterministic_algorithms") for log in logs):
        return "nondeterministic_op_deterministic_on"  # the usual fix was already in force
    if cause == "init_params" and any(e.unwritten for log in logs for e in log.of(InitParams)):
        return "init_params_uninitialised"  # not a seed: memory to_empty() left as it was
    return cause


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _module_of_parameter(name: str | None) -> str | None:
    return name.rsplit(".", 1)[0] if name and "." in name else None


class LargestDifference(TypedDict):
    """The largest parameter and loss differences of two runs within tolerance (None: not measured)."""

    params_max_abs: float | None
    loss_max_abs: float | None


def _largest_difference(curve: list[CurvePoint], logs_a: list[EventLog], logs_b: list[EventLog]) -> LargestDifference:
    """The largest parameter (from snapshots) and loss (from every step) differences seen."""
    losses_b = {(log.rank, s.index): s.loss for log in logs_b for s in log.of(Step)}
    loss = [
        distance(s.loss, loss_b)
        for log in logs_a
        for s in log.of(Step)
        if s.loss is not None and (loss_b := losses_b.get((log.rank, s.index))) is not None
    ]
    kept = [c["max_abs"] for c in curve if c["max_abs"] is not None]
    return {"params_max_abs": max(kept, default=None), "loss_max_abs": max(loss, default=None)}


def curve_estimate_note(curve: list[CurvePoint]) -> str | None:
    """What the curve's estimated points are (None: every point exact): where only sketches were
    kept, max |Δparam| is not known and the L2 difference is estimated."""
    estimated = [c for c in curve if c.get("estimated")]
    if not estimated:
        return None
    dims = min(c["sketch_dims"] or 0 for c in estimated)
    steps = ", ".join(str(c["step"]) for c in estimated[:6]) + (", …" if len(estimated) > 6 else "")
    return (
        f"divergence curve at step(s) {steps}: the parameter difference's L2 norm is estimated from a "
        f"{dims}-dim projection of each tensor, relative error <= {sketch_error(dims):.2f} with probability "
        f">= {SKETCH_CONFIDENCE:.2f}; max |Δparam| is exact only where both runs kept the step's parameters "
        "(the last step, where both ended there) or only tensors small enough to be kept whole differ"
    )


def _step_clock(logs: list[EventLog]) -> str | None:
    """What ended each step: ``optimizer.step()`` or ``backward()`` (no optimizer)."""
    return next((c.note for log in logs for c in log.of(Capability) if c.name == "step_clock"), None)


def determinism_section(
    div: Divergence | None,
    within: bool,
    cause: str | None,
    evidence: JsonObject,
    labels: list[str],
    logs_a: list[EventLog],
    logs_b: list[EventLog],
    curve: list[CurvePoint],
    notes: list[str],
    endings: list[Ending],
    tol: Tolerance,
    unreadable_exit: int,
    pair: tuple[str, str] | None = None,
    first_step: int | None = None,
) -> JsonObject:
    """The report's ``determinism`` section for one pair of runs, its verdict earned from what was
    compared (:func:`~.divergence.coverage`: ``pair`` names the two runs, by default the first and
    last of ``labels``; steps before ``first_step`` are not expected in both) and from how every
    run ended (:mod:`torchrepro.analysis.verdict`). ``curve`` is the parameter difference per
    snapshot step (empty without snapshots)."""
    compared = steps_compared(logs_a, logs_b)
    covered = coverage(logs_a, logs_b, pair or (labels[0], labels[-1]), first_step)
    # a divergence found among steps duplicated or out of order is the damage's, not the runs'
    verdict, exit_code = judge(
        div is not None and not covered.damaged, within, compared, endings, unreadable_exit, covered.incomplete_because
    )
    first: FirstDivergence | None = None
    if div is not None:
        module = (
            evidence.pop("module", None) or div.detail.get("module")
            if div.what == "init_params"
            else (evidence.pop("module", None) or _module_of_parameter(div.detail.get("first_parameter")))
        )
        first = {
            "step": div.step,
            "rank": div.rank,
            "what": div.what,
            "module": module,
            "op": evidence.pop("op", None),
            "source": evidence.pop("source", None),
            "phase": evidence.pop("phase", None),
            "cause": cause,
            "detail": div.detail,
            "evidence": evidence,
        }
        for key in LOCALISATION_KEYS:
            if evidence.get(key) is not None:
                first[key] = evidence[key]
        if div.what == "init_params":
            first["before_step"] = 0
    env = environment_differences(logs_a[0].header, logs_b[0].header) if logs_a and logs_b else []
    det = {
        "verdict": verdict,
        "exit_code": exit_code,
        "runs": labels,
        "first_divergence": first,
        "curve": curve,
        "notes": notes,
        "rtol": tol.rtol,
        "atol": tol.atol,
        "steps_compared": compared,
        "endings": [e.to_json() for e in endings],
        "environment_differences": env,
        "step_clock": _step_clock(logs_a),
        "evidence_compared": covered.compared,
        "not_compared": covered.not_compared,
        "incomplete_because": covered.incomplete_because,
    }
    estimate = curve_estimate_note(curve)
    if estimate:
        notes.append(estimate)
    if verdict == "nothing_compared":
        det["nothing_compared_because"] = nothing_compared_because(endings)
    if verdict == "within_tolerance":
        det["largest_difference"] = _largest_difference(curve, logs_a, logs_b)
    if env and div is None:
        notes.append("the environments differ (" + "; ".join(env[:3]) + "), yet the compared steps agree")
    return det


NOTHING_COMPILED = (
    "nothing was compiled in the run as written (no torch.compile call ran a compiled frame): there is no "
    "compiled code to compare with {against}"
)


def nothing_compiled(det: JsonObject, against: str | None, compiled: list[EventLog]) -> None:
    """``--against``: when the run as written compiled nothing, ``det`` says so and claims nothing
    of compiled against ``against``: runs that agree are ``nothing_compared`` (not bit-exact), and a
    divergence is the script's own (noted: not compiled code's)."""
    if against is None or any(log.of(Compile) for log in compiled):
        return
    because = NOTHING_COMPILED.format(against=against)
    if det["verdict"] in ("bit_exact", "within_tolerance"):
        det["verdict"], det["exit_code"] = "nothing_compared", 1
        det["nothing_compared_because"] = f"{because}; the two runs agree over {det['steps_compared']} step(s)"
    else:
        det["notes"].append(f"{because}: what differs is not compiled code")


def divergence_findings(det: JsonObject, key: str | None) -> list[Finding]:
    """The findings of a ``determinism`` section: the divergence (its cause's hint under ``key``,
    or the measured fix when the fix ladder ran) and every run that did not end normally."""
    fd = det["first_divergence"]
    out = [
        Finding(
            "RUN_DID_NOT_END_NORMALLY",
            "error",
            f"{e['run']} did not end normally: {'; '.join(e['problems'])}",
            hint="The steps it recorded were compared; the verdict cannot cover the whole run. Fix the failure "
            "(its stderr is in the run's run.json) and check again.",
            evidence=e,
        )
        for e in det["endings"]
        if not e["ended_normally"]
    ]
    if det["verdict"] == "incomplete" and det.get("incomplete_because"):
        out.append(
            Finding(
                "COMPARISON_INCOMPLETE",
                "error",
                "the comparison does not cover both runs: " + "; ".join(det["incomplete_because"][:5]),
                hint="Steps or evidence that only one run holds were not compared, so agreement over the rest proves "
                "nothing about them. Record both runs with the same options, from undamaged logs, and compare again.",
                evidence={
                    "incomplete_because": det["incomplete_because"],
                    "evidence_compared": det["evidence_compared"],
                },
            )
        )
    if det["verdict"] == "diverged" and fd is not None:
        hint = CAUSE_HINTS[key or fd["cause"]]
        if det.get("fixes"):  # measured: recommend only what was tried and bit-exact
            why = hint if key == "nondeterministic_kernel" else ""
            hint = " ".join(filter(None, [fix_hint(det["fixes"]), why]))
        out.insert(
            0,
            Finding(
                f"DIVERGED_{fd['cause'].upper()}",
                "error",
                verdict_line(det),
                hint=hint,
                evidence={k: v for k, v in fd.items() if k != "evidence"} | {"evidence": fd["evidence"]},
            ),
        )
    return out
