"""Why two runs diverged: the cause of the first divergence decided from evidence, its hint, and
the report's ``determinism`` section. Pure: event logs, recorded replays and the parameter
difference curve in, a decision out; nothing here imports torch, launches a process or reads a
file (:mod:`torchrepro.commands.check.comparison` runs the scripts and replays, reads the snapshots and calls in).

The evidence is weighed in the order a step happens: the initial parameters, the batch, the RNG
state the step ran with, the runs' environments, the graphs they compiled; what the step-level
evidence cannot decide (``unknown``) is decided by what runs beyond the two show: eager, compiled
and ``fallback_random`` runs side by side (``--against``), repeated compiled graphs, op-level replays.

>>> from torchrepro.analysis.divergence import Divergence
>>> cause, evidence = decide(Divergence(3, 0, "batch"), [], [])
>>> cause, evidence.because, evidence.strength
('data_order', 'the batches of step 3 differ', 'shown')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypedDict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import Capability, Compile, GraphProbe, Step
from .graph_steps import GraphScope
from .divergence import (
    SKETCH_CONFIDENCE,
    Divergence,
    Tolerance,
    compare_replays,
    compile_differences,
    coverage,
    environment_differences,
    first_divergence,
    settings,
    sketch_error,
    steps_compared,
)
from ..eventlog.payloads import JsonObject
from ..reports.check_report import (
    LOCALISATION_KEYS,
    CurvePoint,
    Determinism,
    Evidence,
    FirstDivergence,
    GraphProbeRecord,
    RunEnding,
)
from ..reports.findings import Finding, Verdict, from_fields
from .fix_ranking import fix_hint
from .rank_groups import ranks_label
from .verdict import Ending, judge, nothing_compared_because, verdict_line

Decision = tuple[str, Evidence]  # (cause, the evidence that shows it)

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
    "shared_files": "A run read a file an earlier run wrote in the working directory (a checkpoint the script "
    "resumes from when it is there): the runs did not start from the same files, whatever else differs. Remove "
    "the file before each run (or give the script a fresh checkpoint path per run), or let torchrepro run each "
    "run in a fresh copy of the working directory: leave TORCHREPRO_WORKDIR unset and run from a directory of at "
    "most 256 MiB, passing larger data by absolute path (docs/workdir.md).",
    "unknown": "No evidence points to one cause; rerun with more runs (--runs 3) to see if it repeats.",
    "unknown_diff": "No evidence in the two stored runs points to one cause: torchrepro check SCRIPT runs the "
    "script again with every piece of evidence recorded and localises the divergence.",
}


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

    >>> shared_files([("snapshot.pt", "run-1", "run-2")])[1].because
    'run-1 wrote snapshot.pt in the working directory, run-2 read it'
    """
    path, wrote, read = crossings[0]
    more = f" (and {len(crossings) - 1} more file(s))" if len(crossings) > 1 else ""
    return "shared_files", Evidence(
        f"{wrote} wrote {path} in the working directory, {read} read it{more}",
        strength="shown",
        facts={"files": [{"path": p, "written_by": w, "read_by": r} for p, w, r in crossings[:20]]},
    )


def decide(div: Divergence, logs_a: list[EventLog], logs_b: list[EventLog], same_config: bool = True) -> Decision:
    """The cause that step-level evidence proves, or ``unknown`` (then localisation decides).
    Runs of different compile configurations are expected to compile differently."""
    if div.what == "init_params":
        return "init_params", Evidence(
            "the parameters differ before the first forward "
            f"({div.detail.get('parameters_differing')} tensor(s), first {div.detail.get('first_parameter')})",
            strength="shown",
        )
    if div.what == "batch":
        return "data_order", Evidence(f"the batches of step {div.step} differ", strength="shown")
    # Read at backward(), the state already reflects the forward pass: between different compile
    # configurations that is a consequence (inductor draws its seed from the global generator).
    if div.what == "rng" and (same_config or div.detail.get("read_at") != "backward"):
        at = {"batch": "when its first batch was fetched", "backward": "at its first backward()"}.get(
            div.detail.get("read_at", ""), "at its start"
        )
        return "rng", Evidence(
            f"the torch RNG state of step {div.step} differs ({at}): " + ", ".join(div.detail.get("streams") or []),
            strength="shown",
            facts={"streams": div.detail.get("streams")},
        )
    # a configuration's own switch (fallback_random) is not an environment difference
    env = environment_differences(
        logs_a[0].header, logs_b[0].header, ignore=() if same_config else ("fallback_random",)
    )
    if env:
        return "environment", Evidence("the runs' environments differ", strength="shown", facts={"differences": env})
    graphs = [d for la, lb in zip(logs_a, logs_b) for d in compile_differences(la, lb)] if same_config else []
    if graphs:
        return "recompile", Evidence(
            "the runs compiled different graphs", strength="shown", facts={"differences": graphs}
        )
    return "unknown", Evidence(strength="unexplained")


def numerics_without_inductor() -> Decision:
    """Eager against a compiled run that used no inductor graph: no inductor RNG to blame."""
    return "numerics", Evidence("compiled without inductor RNG: the difference is rounding", strength="inferred")


def numerics_of_modes(mode_a: str | None, mode_b: str | None) -> Decision | None:
    """Two stored runs of different compile modes with no step-level cause: rounding (None when
    the modes are the same)."""
    if mode_a == mode_b:
        return None
    return "numerics", Evidence(f"compile modes differ ({mode_a} vs {mode_b})", strength="inferred")


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
        return "nondeterministic_op", Evidence(
            "the compiled run is not reproducible run to run: two runs as written differ (by "
            f"{_fmt(again['final_max_abs'])} in parameters) by the step at which fallback_random=True and the run "
            f"as written first differ, so that difference ({_fmt(rng['final_max_abs'])}) is the compiled code's own "
            "nondeterminism, not its RNG; only what exceeds it could be RNG",
            strength="inferred",
            facts={"run_to_run": again, "remaining_numerics": numerics},
        )
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
        return "rng", Evidence(because, strength="inferred", facts={"remaining_numerics": numerics})
    return "numerics", Evidence(
        "fallback_random=True does not remove the difference: rounding, not RNG",
        strength="inferred",
        facts={"magnitude": numerics},
    )


def cause_from_kernels(evidence: Evidence, kernels: Evidence) -> Decision:
    """A compiled graph's output differs on identical inputs (``kernels``, from the kernel replays):
    the op is nondeterministic."""
    return "nondeterministic_op", evidence.but(kernels)


def graph_probes(runs: dict[str, list[EventLog]]) -> list[GraphProbeRecord]:
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


def probe_divergence(
    probes: Sequence[GraphProbeRecord], scope: GraphScope | None = None
) -> tuple[Divergence, str, Evidence] | None:
    """The earliest probed graph (by step, then rank) whose outputs were not bit for bit the same
    on identical inputs, among those that can explain the divergent quantity (``scope``; None: any
    graph, where the runs themselves agree): a divergence within one run, its cause
    (``nondeterministic_op``, as the kernel replays conclude) and evidence naming the graph, output,
    node, kernel and source line. None when every such graph repeated bit for bit."""
    found = sorted(
        (p for p in probes if p["differing"] and (scope is None or scope.admits(p["compile_id"], p["graph"]))),
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
    said = Evidence.from_json(
        {k: named[k] for k in (*LOCALISATION_KEYS, *_NAMED) if named.get(k) is not None}
        | {"compile_id": p["compile_id"], "graph": p["graph"]}
    )
    evidence = said.but(
        Evidence(
            because,
            strength="measured",
            scope=scope.text() if scope else None,
            named_by="graph_probe",
            run=p["run"],
            facts={
                "probe": {k: p[k] for k in ("run", "repeats", "runs_differing", "threads", "differing", "max_abs")},
                "thread_dependence": {
                    "threads": p["threads"],
                    "repeats": p["repeats"],
                    "repeats_differ": True,
                    "one_thread": p.get("one_thread"),
                },
            },
        )
    )
    step = p["step"] if p["step"] is not None else 0
    detail = {"run": p["run"], "compile_id": p["compile_id"], "graph": p["graph"]}
    return Divergence(step, p["rank"], "compiled_graph", detail), "nondeterministic_op", evidence


_NAMED = ("op", "source", "module", "kernel_atomic_add", "accumulating_node", "eager_node")  # what a probe names
# what a graph replay against eager names: kept under ``against_eager`` where a race is named instead
_AGAINST_EAGER = ("localisation", *LOCALISATION_KEYS, "op", "module", "source", "output_max_abs", "first_differing")


def name_the_race(evidence: Evidence, race: Evidence) -> Evidence:
    """``check --against``: the compiled run is not reproducible run to run (cause
    ``nondeterministic_op``) and its own probe found the graph that is not (``race``, the evidence of
    :func:`probe_divergence`): that graph, its op, kernel and source line are what the evidence
    names, beside why the cause was decided; where compiled first departs from eager (the graph
    replay's localisation) is kept under ``against_eager``.

    >>> found = Evidence("graph 0/1 differs", named_by="graph_probe", graph="backward", op="aten.add")
    >>> replayed = Evidence("not reproducible", op="aten.mm", localisation="compiled_graph")
    >>> named = name_the_race(replayed, found)
    >>> named.op, named.graph, named.facts["against_eager"], named.because
    ('aten.add', 'backward', {'localisation': 'compiled_graph', 'op': 'aten.mm'}, 'not reproducible; graph 0/1 differs')
    """
    against = {k: v for k, v in evidence.to_json().items() if k in _AGAINST_EAGER or k == "random_nodes"}
    kept = Evidence(
        quantity=evidence.quantity,
        strength=evidence.strength,
        scope=evidence.scope,
        localisation_note=evidence.localisation_note,
        facts={k: v for k, v in evidence.facts.items() if k not in against},
    )
    because = "; ".join(filter(None, [evidence.because, race.because]))
    named = kept.but(race)
    return dataclasses.replace(named, because=because, facts={**named.facts, "against_eager": against})


def not_localised(cause: str | None, why: str) -> Evidence:
    """Evidence when localisation itself failed: why (an exception's first line, or a replay that
    ended early), and what was still concluded without it."""
    return Evidence(
        localisation="not_localised",
        localisation_note=f"localisation failed ({why}); still concluded from the step records: "
        f"cause {cause or 'unknown'}",
        facts={"localisation_failed": why},
    )


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
        return ("nondeterministic_op" if same_config and cause == "unknown" else cause), Evidence(localisation=where)
    kind = found.pop("kind")
    new_cause = (
        cause
        if cause == "init_params"
        else {"rng": "rng", "nondeterministic_op": "nondeterministic_op"}.get(kind, cause)
    )
    return new_cause, Evidence.from_json({**found, "localisation": kind, "strength": "measured"})


def graph_evidence(
    replay: JsonObject | None,
    scope: GraphScope,
    cause: str | None = None,
    failure: str | None = None,
    probes: Sequence[GraphProbeRecord] = (),
) -> Evidence:
    """The divergent step replayed compiled, each compiled graph call checked against its eager FX
    graph, and the compiled run's ``probes`` (each forward and backward graph AOTAutograd made,
    against the same graph run eagerly on the same inputs): among the graphs that can explain the
    divergent quantity (``scope``: for a gradient, only graphs whose backward ran in that step, never
    one that ran under ``no_grad`` alone), in the order the step called them, the first that departs
    from eager, and where: the random op its differing output depends on when the cause is ``rng``;
    else the op where its forward first departs (:func:`first_forward_node`: a saved activation such
    as a LayerNorm's statistics comes before the logits computed from it), else its differing
    output's own node (an inert random op is not blamed for rounding); in a backward, the first
    gradient it computes unlike eager (:func:`backward_evidence`). A replay without a record, or a
    graph the check failed on, is said, with what was still concluded."""
    if replay is None:
        return not_localised(cause, failure or "the graph replay wrote no record")
    calls = [g for g in replay.get("graphs", []) if scope.admits(g["compile_id"], "forward")]
    errors = [f"compiled graph {g['compile_id']}: {g['error']}" for g in calls if "error" in g]
    differing: dict[str, JsonObject] = {}
    for g in calls:
        if "first_differing_output" in g:
            differing.setdefault(g["compile_id"], g)
    order = scope.graphs
    if order is None:  # not known which graphs ran: the replay's order, then the probes'
        ids = list(dict.fromkeys([g["compile_id"] for g in calls] + [p["compile_id"] for p in probes]))
        order = tuple([(cid, "forward") for cid in ids] + [(cid, "backward") for cid in ids])
    said = Evidence(scope=scope.text())
    forward = (
        f"the {len(calls)} compiled graph call(s) of step {replay.get('step', scope.step)} match their eager FX "
        "graphs in the forward pass"
    )
    for compile_id, graph in order:
        found = (
            _forward_departure(differing.get(compile_id), compile_id, cause, probes)
            if graph == "forward"
            else backward_evidence(forward, probes, compile_id)
        )
        if found is not None:
            if errors:
                found = found.noted("checking some graphs failed: " + "; ".join(errors[:2]))
            return said.but(found)
    if errors:
        return said.but(not_localised(cause, "; ".join(errors[:2])))
    return said.but(Evidence(localisation=f"{forward} (the difference arises in backward)"))


def _forward_departure(
    check: JsonObject | None, compile_id: str, cause: str | None, probes: Sequence[GraphProbeRecord]
) -> Evidence | None:
    """Where ``compile_id``'s forward departs from eager: ``check`` (its call at the step, replayed
    against its eager FX graph, with the output that differs) and its forward's probe; None when
    neither shows it departing."""
    random = (check or {}).get("depends_on_random") or []
    earliest = first_forward_node(probes, compile_id)
    if check is None and earliest is None:
        return None
    output = (
        Evidence(
            output=f"output {check['first_differing_output']} ({check.get('target')}, FX node {check.get('node')})",
            facts={"output_max_abs": check.get("max_abs")} | ({"random_nodes": random} if random else {}),
        )
        if check is not None
        else Evidence()
    )
    base = Evidence(localisation="compiled_graph", strength="measured", compile_id=compile_id, graph="forward")
    if check is not None and (cause == "rng" and random or earliest is None):
        origin = random[0] if cause == "rng" and random else check
        return base.but(output).but(
            Evidence(
                op=f"{origin.get('target')} (FX node {origin.get('node')}, compiled graph {compile_id})",
                module=origin.get("module"),
                source=origin.get("source"),
            )
        )
    assert earliest is not None
    return base.but(output).but(earliest)


def _unlike_eager(
    probes: Sequence[GraphProbeRecord], graph: str, compile_id: str | None = None
) -> GraphProbeRecord | None:
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


def first_forward_node(probes: Sequence[GraphProbeRecord], compile_id: str) -> Evidence | None:
    """Where compiled graph ``compile_id``'s forward first departs from the same FX graph run eagerly
    (the graph AOTAutograd made, on the same inputs, as a probe compared them): the earliest output
    in the graph's order that differs (a saved activation, such as the first LayerNorm's statistics,
    comes before the logits computed from it), as the op, module and source line the evidence names.
    None when no probe compared that forward graph with eager, or it matched."""
    found = _unlike_eager(probes, "forward", compile_id)
    named: JsonObject = found["eager_explained"] if found is not None else {}
    if not named.get("node"):
        return None
    return Evidence(
        op=f"{named.get('op')} (FX node {named['node']}, compiled graph {compile_id}, forward)",
        module=named.get("module"),
        source=named.get("source"),
        kernel=named.get("kernel"),
        kernel_fuses=named.get("kernel_fuses"),
        facts={"first_differing": named.get("output")},
    )


def backward_evidence(
    forward: str, probes: Sequence[GraphProbeRecord], compile_id: str | None = None
) -> Evidence | None:
    """The first backward graph (of ``compile_id`` when given) a probe found unlike its FX graph run
    eagerly (the graph AOTAutograd made, as aot_eager runs it), on the same inputs: the output (a
    parameter's gradient) computed first in the graph's order that differs, its node, op and source
    line, ``forward`` saying why the forward is not blamed. None when no probe compared a backward
    graph with eager, or every one matched."""
    found = _unlike_eager(probes, "backward", compile_id)
    if found is None:
        return None
    named = found.get("eager_explained") or {}
    what = f"the gradient of {named['parameter']}" if named.get("parameter") else f"output {named.get('output_index')}"
    said = {
        k: named.get(k) for k in ("parameter", "node", "op", "module", "source", "kernel", "kernel_fuses", "output")
    }
    return Evidence.from_json({k: v for k, v in said.items() if v is not None}).but(
        Evidence(
            f"{forward}; in backward, compiled graph {found['compile_id']} differs from the same FX graph "
            f"run eagerly on the same inputs ({len(found['eager_differing'])} output(s)), first at {what}"
            + (f", by up to {named['max_abs']:.3g}" if named.get("max_abs") is not None else ""),
            strength="measured",
            localisation="backward_graph",
            compile_id=found["compile_id"],
            graph="backward",
        )
    )


def hint_key(cause: str, against: str | None, logs: list[EventLog], evidence: Evidence | None = None) -> str:
    """Which of :data:`CAUSE_HINTS` fits: the cause, made precise by what the runs show (inductor's
    RNG against eager, an atomic-add kernel, deterministic algorithms already on)."""
    if cause == "rng" and against:
        return "rng_compiled"
    if cause == "nondeterministic_op" and evidence is not None and evidence.kernel_atomic_add:
        return "nondeterministic_kernel"
    if cause == "nondeterministic_op" and any(settings(log).get("deterministic_algorithms") for log in logs):
        return "nondeterministic_op_deterministic_on"  # the usual fix was already in force
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
        abs(s.loss - loss_b)
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
    decision: Decision | None,
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
    against: str | None = None,
    more: JsonObject | None = None,
) -> Determinism:
    """The report's ``determinism`` section for one pair of runs, its verdict earned from what was
    compared (:func:`~.divergence.coverage`: ``pair`` names the two runs, by default the first and
    last of ``labels``; steps before ``first_step`` are not expected in both) and from how every
    run ended (:mod:`torchrepro.analysis.verdict`); the first divergence with its cause and evidence
    (``decision``). ``curve`` is the parameter difference per snapshot step (empty without
    snapshots); ``against``: the reference a compiled run (``logs_b``) was compared with, which
    claims nothing where it compiled nothing (:data:`NOTHING_COMPILED`); ``more``: what only some
    checks add (``decomposition``, ``fixes``, ``graph_probes``...), as it is."""
    compared = steps_compared(logs_a, logs_b)
    covered = coverage(logs_a, logs_b, pair or (labels[0], labels[-1]), first_step)
    notes = list(notes)
    # a divergence found among steps duplicated or out of order is the damage's, not the runs'
    verdict, _ = judge(
        div is not None and not covered.damaged, within, compared, endings, unreadable_exit, covered.incomplete_because
    )
    first = _first(div, decision) if div is not None else None
    env = environment_differences(logs_a[0].header, logs_b[0].header) if logs_a and logs_b else []
    extra: JsonObject = {
        "evidence_compared": covered.compared,
        "not_compared": covered.not_compared,
        "incomplete_because": covered.incomplete_because,
    }
    estimate = curve_estimate_note(curve)
    if estimate:
        notes.append(estimate)
    if verdict == "nothing_compared":
        extra["nothing_compared_because"] = nothing_compared_because(endings)
    if verdict == "within_tolerance":
        extra["largest_difference"] = _largest_difference(curve, logs_a, logs_b)
    if env and div is None:
        notes.append("the environments differ (" + "; ".join(env[:3]) + "), yet the compared steps agree")
    if against is not None and not any(log.of(Compile) for log in logs_b):
        because = NOTHING_COMPILED.format(against=against)
        if verdict in ("bit_exact", "within_tolerance"):
            verdict = "nothing_compared"
            extra["nothing_compared_because"] = f"{because}; the two runs agree over {compared} step(s)"
        else:
            notes.append(f"{because}: what differs is not compiled code")
    return Determinism(
        Verdict(verdict),
        labels,
        compared,
        [from_fields(RunEnding, dict(e.to_json())) for e in endings],
        first,
        curve,
        notes,
        tol.rtol,
        tol.atol,
        env,
        _step_clock(logs_a),
        {**extra, **(more or {})},
    )


def _first(div: Divergence, decision: Decision | None) -> FirstDivergence:
    """The first divergence as reported: its cause and evidence, the evidence's module where the
    localisation named none (the first parameter that differs), what it explains (the quantity)."""
    cause, evidence = decision or (None, Evidence())
    module = evidence.module or (
        div.detail.get("module")
        if div.what == "init_params"
        else _module_of_parameter(div.detail.get("first_parameter"))
    )
    evidence = dataclasses.replace(evidence, module=module, quantity=evidence.quantity or div.what)
    return FirstDivergence(
        div.step, div.rank, div.what, cause, evidence, div.detail, 0 if div.what == "init_params" else None
    )


NOTHING_COMPILED = (
    "nothing was compiled in the run as written (no torch.compile call ran a compiled frame): there is no "
    "compiled code to compare with {against}"
)


def divergence_findings(det: Determinism, key: str | None) -> list[Finding]:
    """The findings of a ``determinism`` section: the divergence (its cause's hint under ``key``,
    or the measured fix when the fix ladder ran) and every run that did not end normally."""
    fd = det.first_divergence
    out = [
        Finding(
            "RUN_DID_NOT_END_NORMALLY",
            "error",
            f"{e.run} did not end normally: {'; '.join(e.problems)}",
            hint="The steps it recorded were compared; the verdict cannot cover the whole run. Fix the failure "
            "(its stderr is in the run's run.json) and check again.",
            evidence=dataclasses.asdict(e),
        )
        for e in det.endings
        if not e.ended_normally
    ]
    incomplete = det.more.get("incomplete_because")
    if det.verdict is Verdict.INCOMPLETE and incomplete:
        out.append(
            Finding(
                "COMPARISON_INCOMPLETE",
                "error",
                "the comparison does not cover both runs: " + "; ".join(incomplete[:5]),
                hint="Steps or evidence that only one run holds were not compared, so agreement over the rest proves "
                "nothing about them. Record both runs with the same options, from undamaged logs, and compare again.",
                evidence={"incomplete_because": incomplete, "evidence_compared": det.more.get("evidence_compared")},
            )
        )
    if det.verdict is Verdict.DIVERGED and fd is not None and fd.cause is not None:
        hint = CAUSE_HINTS[key or fd.cause]
        fixes = det.more.get("fixes")
        if fixes:  # measured: recommend only what was tried and bit-exact
            why = hint if key == "nondeterministic_kernel" else ""
            hint = " ".join(filter(None, [fix_hint(fixes), why]))
        out.insert(
            0,
            Finding(f"DIVERGED_{fd.cause.upper()}", "error", verdict_line(det), hint=hint, evidence=fd.to_json()),
        )
    return out
