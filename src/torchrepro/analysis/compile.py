"""Compile health: counts, recompiles by cause, graph breaks by location, cache hit rates,
compile time, and the findings (with fixes) that follow from them."""

from __future__ import annotations

from dataclasses import replace

import linecache
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable

from ..eventlog.event_reader import EventLog
from ..eventlog.events import CacheLookup, Capability, Compile, Counters, GraphBreak, Step
from .categories import category_of, guard_text
from ..reports.doctor_report import (
    CacheCounts,
    CapabilityNote,
    CompileSection,
    GraphBreakEvent,
    RankCompiles,
    RecompileEvent,
)
from ..reports.findings import Finding

RECOMPILE_HINTS = {
    "shape": "Mark the varying dimension dynamic before the first call "
    "(torch._dynamo.mark_dynamic(x, 0)) or compile with dynamic=True.",
    "dtype": "Feed the compiled function one dtype: cast inputs before the call (look for .double() data "
    "or tensors created outside autocast).",
    "device": "Keep the compiled function's inputs on one device (move data before the call).",
    "stride": "Give the compiled function one memory layout: call .contiguous(), or use channels_last "
    "everywhere or nowhere.",
    "requires_grad": "Do not flip requires_grad on inputs or parameters between calls; freeze parameters "
    "before compiling, or compile the frozen and trainable variants separately.",
    "grad_mode": "Calling the model under torch.no_grad()/inference_mode (evaluation) compiles a second "
    "graph: expected once. If it repeats, evaluate outside the hot loop or compile a separate "
    "eval function.",
    "autocast": "Enter and leave torch.autocast outside the compiled function, the same way on every call.",
    "global_state": "Set TF32, matmul precision, deterministic algorithms, default dtype and thread counts "
    "once, before the first compiled call; toggling them in the loop recompiles.",
    "python_value": "A Python int/float/bool argument is baked into the graph: pass it as a tensor, or branch "
    "on bools outside the compiled function (ints become dynamic after a second value).",
    "module_attribute": "A module attribute read in forward changed: int attributes are static (set "
    "torch._dynamo.config.allow_unspec_int_on_nn_module = True, or keep the value in a tensor "
    "buffer); for other attributes, set them once before compiling.",
    "python_global": "A Python global read inside the compiled code changed: hoist it out (read it once and "
    "pass it as an argument) or keep it constant.",
    "object_identity": "A different object (module, function, class) was passed on each call: pass the same "
    "object, or compile each variant once.",
    "other": "Read the guard text; TORCH_LOGS=recompiles_verbose lists every failed guard.",
}

GRAPH_BREAK_HINTS = (
    (
        re.compile(r"item\(\)|Tensor\.item|scalar output", re.I),
        "Keep .item() (e.g. loss logging) outside the compiled region, or set "
        "torch._dynamo.config.capture_scalar_outputs = True.",
    ),
    (
        re.compile(r"Data-dependent branching", re.I),
        "Replace the Python `if` on a tensor with torch.where or torch.cond.",
    ),
    (
        re.compile(r"builtin operator.*print|`print`", re.I),
        "Remove print() from the compiled code, or add it to torch._dynamo.config.reorderable_logging_functions.",
    ),
    (
        re.compile(r"nonzero|dynamic shape operator|data-dependent output shape", re.I),
        "Boolean-mask indexing has a data-dependent shape: use torch.where/masked ops, or set "
        "torch._dynamo.config.capture_dynamic_output_shape_ops = True.",
    ),
    (
        re.compile(r"manual_seed|get_rng_state|set_rng_state", re.I),
        "Seed and save RNG state outside the compiled function.",
    ),
)

# a shape guard: the tensor (as the guard names it), the dimension, the size expected and the size seen
# torch 2.13 names the tensor as the code does ('x'), torch 2.6 as the guard does ('L['x']')
SIZE_GUARD = re.compile(r"tensor '(.+?)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)")


TRAINING_HINT = (
    "model.train()/model.eval() switches compile one graph per mode (switching back reuses it): "
    "fine once, but keep evaluation out of the hot loop or compile a separate eval function."
)
STACK_HINT = (
    "The guarded value (___stackN) was computed before a graph break and passed into the code after it "
    "(e.g. the float from .item()): remove that graph break (see the graph breaks below) and this "
    "recompile goes with it."
)


def recompile_hint(category: str | None, reasons: list[str]) -> str:
    """The fix for a group of recompiles of one category, specialised by what the guards say."""
    guards = " ".join(guard_text(r) for r in reasons)
    if "___stack" in guards:
        return STACK_HINT
    if category == "shape":
        return _shape_hint(reasons)
    if category == "module_attribute" and ".training" in guards:
        return TRAINING_HINT
    return RECOMPILE_HINTS.get(category or "other", RECOMPILE_HINTS["other"])


def _variable(name: str) -> str:
    """The guard's name of a tensor as the user's code names it: ``L['idx']`` → ``idx``."""
    m = re.fullmatch(r"L\['([^']+)'\]", name)
    return m.group(1) if m else name


def _shape_hint(reasons: list[str]) -> str:
    """The shape hint, naming the tensor and dimension the guard is on (``mark_dynamic(idx, 1)``).

    >>> _shape_hint(["tensor 'idx' size mismatch at index 1. expected 8, actual 9"])
    'Mark the varying dimension dynamic before the first call (torch._dynamo.mark_dynamic(idx, 1)) or compile with dynamic=True.'
    >>> guard = "size mismatch at index 1. expected 8, actual 9"
    >>> _shape_hint([f"tensor 'L['idx']' {guard}"]) == _shape_hint([f"tensor 'idx' {guard}"])  # torch 2.6, 2.13
    True
    """
    found = [m for reason in reasons for m in [SIZE_GUARD.search(reason)] if m]
    marks = list(dict.fromkeys(f"torch._dynamo.mark_dynamic({_variable(m.group(1))}, {m.group(2)})" for m in found))
    hint = RECOMPILE_HINTS["shape"]
    if marks:
        hint = hint.replace("torch._dynamo.mark_dynamic(x, 0)", "; ".join(marks[:3]))
    for m in found:
        if m.group(2) == "0" and int(m.group(4)) < int(m.group(3)):
            return (
                f"The leading dimension of {_variable(m.group(1))} shrank ({m.group(3)} → {m.group(4)}): a short "
                "last batch. Use drop_last=True, pad the last batch, or " + hint[0].lower() + hint[1:]
            )
    return hint


def _graph_break_hint(event: GraphBreak) -> str:
    text = f"{event.reason} {event.explanation}"
    for pattern, hint in GRAPH_BREAK_HINTS:
        if pattern.search(text):
            return hint
    return event.hints[0] if event.hints else "See the graph-break reason; TORCH_LOGS=graph_breaks shows each one."


def source_line(file: str | None, line: int | None) -> str | None:
    """The text of ``file:line`` as it is on disk now (at analysis time), or None."""
    if not file or not line:
        return None
    return linecache.getline(file, line).strip() or None


def _where(file: str | None, line: int | None) -> str | None:
    return f"{file}:{line}" if file else None


_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")  # Dynamo's name for the code after a break
_TORCH_INTERNAL = re.compile(r"[/\\](site|dist)-packages[/\\]torch[/\\]")


def display_function(c: Compile, among: Iterable[Compile] = ()) -> str:
    """A name a user recognises. The code Dynamo resumes after a graph break
    (``torch_dynamo_resume_in_forward_at_72``, a resume of a resume nested in the name) is its
    function and the break it follows: ``Classifier.forward (resumed after the break at
    train.py:72)``, the function named as its own compile is in ``among`` (the rank's compiles: the
    one of that name in the same file that starts last before the break), else by its bare name. A
    compiled module entered through torch internals (``inner``, or a torch module's forward such
    as ``Sequential.forward`` as capture names it) is named by its call site.

    >>> display_function(Compile(function="torch_dynamo_resume_in_f_at_9", file="t.py", line=9))
    'f (resumed after the break at t.py:9)'
    """
    name = c.function or "?"
    if m := _RESUME.match(name):
        function, line = m.group(1), int(m.group(2))
        while inner := _RESUME.match(function):  # the break of the outer name is the one this code follows
            function = inner.group(1)
        where = _where(c.file, line) or f"line {line}"
        return f"{_resumed_function(function, c.file, line, among)} (resumed after the break at {where})"
    if c.file and _TORCH_INTERNAL.search(c.file) and c.call_site:
        return f"{name} called at {c.call_site}" if name.endswith(".forward") else f"compiled call at {c.call_site}"
    return name


def _resumed_function(function: str, file: str | None, line: int, among: Iterable[Compile]) -> str:
    """The name ``function``'s own compile has (``forward`` -> ``Classifier.forward``): the compile
    of that code name in ``file`` that starts last at or before ``line``; ``function`` itself if none."""
    frames = [
        (c.line, c.function)
        for c in among
        if c.function
        and c.file == file
        and c.line is not None
        and c.line <= line
        and c.function.rsplit(".", 1)[-1] == function
        and not _RESUME.match(c.function)
    ]
    return max(frames)[1] if frames else function


def completed(compiles: list[Compile]) -> list[Compile]:
    """The compiles that made code: not a recompile-limit hit, not a compile that failed (the frame
    then runs eagerly: Dynamo's compilation metrics record it with a ``fail_type``)."""
    return [c for c in compiles if not c.limit_hit and not c.fail_type]


def last_steps(logs: list[EventLog]) -> dict[int, int]:
    """Each rank's last step index (ranks without steps absent)."""
    out = {}
    for log in logs:
        if log.kept is not None:  # read with its steps reduced (doctor): the reduction keeps the last index
            last = getattr(log.kept, "last_index", None)
        else:
            steps = log.of(Step)
            last = steps[-1].index if steps else None
        if isinstance(last, int):
            out[log.rank] = last
    return out


def placed(step: int | None, rank: int, last: dict[int, int]) -> tuple[int | None, bool]:
    """Where an event stamped ``step`` (the step in progress when it happened) took place: that
    step, or, stamped past the rank's last step (after the last step had ended: a final evaluation),
    the last step and True (after it)."""
    if step is not None and rank in last and step > last[rank]:
        return last[rank], True
    return step, False


def summarize(logs: list[EventLog]) -> tuple[CompileSection, list[Finding]]:
    """The ``compile`` section of the report and its findings, over every rank's events."""
    last = last_steps(logs)
    # an event after a rank's last step is placed at that step (and said to be after it)
    after = {(c.rank, c.compile_id) for log in logs for c in log.of(Compile) if placed(c.step, c.rank, last)[1]}
    compiles: list[Compile] = [
        replace(e, step=placed(e.step, e.rank, last)[0]) if (e.rank, e.compile_id) in after else e
        for log in logs
        for e in log.of(Compile)
    ]
    # every break record, as TORCH_LOGS=graph_breaks logs them and tlparse lists them: a break Dynamo
    # cannot resume from is one record where it restarts or skips the frame, and one more where it meets the
    # break again (docs/evidence/accuracy.md)
    breaks = [replace(e, step=placed(e.step, e.rank, last)[0]) for log in logs for e in log.of(GraphBreak)]
    lookups: list[CacheLookup] = [e for log in logs for e in log.of(CacheLookup)]
    done = completed(compiles)
    recompiles = [c for c in done if c.is_recompile]
    of_rank = {log.rank: log.of(Compile) for log in logs}

    def function(c: Compile) -> str:
        return display_function(c, of_rank.get(c.rank, ()))

    recompile_events: list[RecompileEvent] = []
    for c in recompiles:
        category = category_of(c)
        event: RecompileEvent = {
            "rank": c.rank,
            "compile_id": c.compile_id,
            "function": function(c),
            "code": c.function,
            "file": c.file,
            "line": c.line,
            "step": c.step,
            "reason": c.recompile_reasons[0],
            "guard": guard_text(c.recompile_reasons[0]),
            "category": category,
            "evaluation": for_evaluation(category, c.recompile_reasons[0]),
        }
        if (c.rank, c.compile_id) in after:
            event["after_step"] = True
        recompile_events.append(event)

    grouped: dict[tuple[int, str, str | None, str | None, int | None], GraphBreakEvent] = {}
    sources: dict[tuple[str | None, int | None], str | None] = {}  # (file, line): its text, read once per analysis
    for b in breaks:
        key = (b.rank, b.reason, b.gb_id, b.file, b.line)
        entry = grouped.get(key)
        if entry is None:
            source, where = b.source, (b.file, b.line)
            if not source:
                if where not in sources:
                    sources[where] = source_line(b.file, b.line)
                source = sources[where]
            entry = grouped[key] = {
                "rank": b.rank,
                "reason": b.reason,
                "gb_id": b.gb_id,
                "file": b.file,
                "line": b.line,
                "source": source,
                "count": 0,
                "first_step": b.step,
                "hint": _graph_break_hint(b),
            }
        entry["count"] += 1

    cache = _cache_summary(lookups, done)
    compile_time = sum(c.seconds for c in compiles)
    section: CompileSection = {
        "compiles": len(done),
        "recompiles": len(recompiles),
        "graph_breaks": len(breaks),
        "unique_graphs": _unique_graphs(logs),
        "compile_time_s": round(compile_time, 3),
        "build_time_s": round(sum(c.build_s or 0.0 for c in compiles), 3),
        "capture_overhead_s": round(sum(c.logging_overhead_s or 0.0 for c in compiles), 3),
        "cache": cache,
        "recompile_limit_hits": [
            {
                "rank": c.rank,
                "compile_id": c.compile_id,
                "function": function(c),
                "file": c.file,
                "line": c.line,
                "step": c.step,
                "limit": c.limit_hit,
                "last_reason": c.recompile_reasons[0] if c.recompile_reasons else None,
            }
            for c in compiles
            if c.limit_hit
        ],
        "recompile_events": recompile_events,
        "recompiles_by_category": dict(Counter(category_of(c) for c in recompiles)),
        "graph_break_events": list(grouped.values()),
        "per_rank": _per_rank(logs),
    }
    findings = (
        _recompile_findings(recompiles, function)
        + _limit_findings(compiles, function)
        + _break_findings(grouped.values())
        + _failure_findings(compiles)
        + _no_graph_findings(logs, section)
    )
    return section, findings


def _no_graph_findings(logs: list[EventLog], section: CompileSection) -> list[Finding]:
    """Frames compiled, yet not one graph: everything the user compiled runs eagerly."""
    if not section["compiles"] or section["unique_graphs"] or not all(log.of(Counters) for log in logs):
        return []
    return [
        Finding(
            "NO_GRAPH_COMPILED",
            "error",
            f"torch.compile handled {section['compiles']} frame(s) but produced no graph: the compiled code runs "
            "EAGERLY",
            hint="A wrapper Dynamo cannot trace into was compiled: with DDP compile the inner module, "
            "DDP(torch.compile(model)) (on torch 2.13 torch.compile(DDP(model)) yields no graph). The graph "
            "breaks below show where tracing stopped.",
            evidence={"compiles": section["compiles"], "graph_breaks": section["graph_breaks"]},
        )
    ]


def _unique_graphs(logs: list[EventLog]) -> int:
    total = 0
    for log in logs:
        counters = log.of(Counters)
        if counters:
            c = counters[-1].counters
            total += c.get("stats", {}).get("unique_graphs", c.get("torchrepro", {}).get("unique_graphs_traced", 0))
    return total


def _cache_summary(lookups: list[CacheLookup], compiles: list[Compile]) -> dict[str, CacheCounts]:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    if lookups:
        for lookup in lookups:
            counts[lookup.cache][lookup.status] += 1
    else:  # logs without per-lookup records: the per-compile counts
        for c in compiles:
            for name, statuses in c.cache.items():
                counts[name].update(statuses)
    out: dict[str, CacheCounts] = {}
    for name, n in sorted(counts.items()):
        looked = n["hit"] + n["miss"]
        out[name] = {
            "hit": n["hit"],
            "miss": n["miss"],
            "bypass": n["bypass"],
            "hit_rate": round(n["hit"] / looked, 4) if looked else None,
        }
    return out


def _per_rank(logs: list[EventLog]) -> dict[str, RankCompiles]:
    out: dict[str, RankCompiles] = {}
    for log in logs:
        done = completed(log.of(Compile))
        out[str(log.rank)] = {
            "compiles": len(done),
            "recompiles": sum(c.is_recompile for c in done),
            "graph_breaks": len(log.of(GraphBreak)),
            "limit_hits": sum(bool(c.limit_hit) for c in log.of(Compile)),
            "compile_time_s": round(sum(c.seconds for c in log.of(Compile)), 3),
        }
    return out


# What an expected recompile is, without saying which of the two graphs came first: a script may
# evaluate before it trains (nanoGPT's estimate_loss() at iteration 0), so the recompile is the training graph
EXPECTED_PAIR = {
    "grad_mode": "one graph with gradients and one without",
    "module_attribute": "one graph for train() and one for eval()",
}


def for_evaluation(category: str | None, reason: str) -> bool:
    """Whether a recompile (its category and guard ``reason``) is the graph evaluation needs: a call
    under ``no_grad``/``inference_mode``, or after ``model.eval()`` (a guard on a module's ``training`` flag)."""
    return category == "grad_mode" or (category == "module_attribute" and ".training" in reason)


def _recompile_findings(recompiles: list[Compile], function_of: Callable[[Compile], str]) -> list[Finding]:
    groups: dict[tuple[str, str | None, bool], list[Compile]] = defaultdict(list)
    for c in recompiles:
        category = category_of(c)
        groups[(function_of(c), category, for_evaluation(category, c.recompile_reasons[0]))].append(c)
    findings = []
    for (function, category, evaluation), items in groups.items():
        file, line = items[0].file, items[0].line
        reasons = [c.recompile_reasons[0] for c in items]
        hint = recompile_hint(category, reasons)
        # one evaluation graph per rank is what evaluating costs, nothing to fix; more is a problem
        expected = evaluation and max(Counter(c.rank for c in items).values()) == 1
        findings.append(
            Finding(
                code=f"RECOMPILE_{(category or 'other').upper()}",
                severity="info" if expected else "warning",
                title=f"{function} recompiled {len(items)}x ({category or 'other'}"
                + (f", expected: {EXPECTED_PAIR[category or '']}" if expected else "")
                + f"): {guard_text(reasons[0])}",
                hint=hint,
                evidence={
                    "function": function,
                    "location": _where(file, line),
                    "count": len(items),
                    "expected": expected,
                    "ranks": sorted({c.rank for c in items}),
                    "steps": [c.step for c in items][:20],
                    "compile_ids": [c.compile_id for c in items][:20],
                    "reasons": reasons[:5],
                },
            )
        )
    return findings


def _limit_findings(compiles: list[Compile], function_of: Callable[[Compile], str]) -> list[Finding]:
    """An error per recompile-limit hit: ``recompile_limit`` (torch 2.7 on) or ``cache_size_limit`` (2.6),
    each named with the switch of its own torch that makes the hit fail loudly."""
    return [
        Finding(
            code="RECOMPILE_LIMIT_HIT",
            severity="error",
            title=f"{function_of(c)} hit torch._dynamo.config.{c.limit_hit}: new inputs now run EAGER, silently",
            hint="Fix the recompile cause below; raising the limit only delays it. Use "
            f"torch._dynamo.config.{_fail_on_limit(c.limit_hit)} = True to fail loudly.",
            evidence={
                "rank": c.rank,
                "compile_id": c.compile_id,
                "step": c.step,
                "location": _where(c.file, c.line),
                "last_reason": c.recompile_reasons[0] if c.recompile_reasons else None,
            },
        )
        for c in compiles
        if c.limit_hit
    ]


def _fail_on_limit(limit: str | None) -> str:
    """The switch that turns a hit of ``limit`` into an error: torch 2.6's names its limits ``*cache_size_limit``."""
    return "fail_on_cache_limit_hit" if limit and "cache_size_limit" in limit else "fail_on_recompile_limit_hit"


def _break_findings(events: Iterable[GraphBreakEvent]) -> list[Finding]:
    merged: dict[tuple[str, str | None, int | None], tuple[GraphBreakEvent, set[int], int]] = {}
    for entry in events:  # one finding per location, over ranks: the first rank's entry, the ranks, the count
        key = (entry["reason"], entry["file"], entry["line"])
        first, ranks, count = merged.get(key, (entry, set(), 0))
        merged[key] = (first, ranks | {entry["rank"]}, count + entry["count"])
    return [
        Finding(
            code="GRAPH_BREAK",
            severity="warning",
            title=f"graph break at {_where(m['file'], m['line']) or 'unknown location'}: {m['reason']}"
            + (f" [{m['gb_id']}]" if m["gb_id"] else ""),
            hint=m["hint"],
            evidence={
                "location": _where(m["file"], m["line"]),
                "source": m["source"],
                "gb_id": m["gb_id"],
                "count": count,
                "ranks": sorted(ranks),
                "first_step": m["first_step"],
            },
        )
        for m, ranks, count in merged.values()
    ]


def _failure_findings(compiles: list[Compile]) -> list[Finding]:
    return [
        Finding(
            code="COMPILE_FAILED",
            severity="warning",
            title=f"compiling {c.function or c.compile_id} failed ({c.fail_type})"
            + (f": {c.fail_reason}" if c.fail_reason else ""),
            hint="This frame runs eagerly. TORCH_LOGS=dynamo shows the full error.",
            evidence={"rank": c.rank, "compile_id": c.compile_id, "step": c.step, "location": _where(c.file, c.line)},
        )
        for c in compiles
        if c.fail_type and not c.limit_hit
    ]


def capabilities(logs: list[EventLog]) -> list[CapabilityNote]:
    """What capture could and could not observe, per name (first rank's word). The private torch
    APIs capture found (``torch_api.*``, all of them on a supported torch) stay in the event log;
    the report names those it did not."""
    seen: dict[str, CapabilityNote] = {}
    for log in logs:
        for cap in log.of(Capability):
            if cap.available and cap.name.startswith("torch_api."):
                continue
            seen.setdefault(cap.name, {"name": cap.name, "available": cap.available, "note": cap.note})
    return list(seen.values())
