"""``doctor --fixes``' decisions: which mechanical compile fix each recompile or graph break of a
run has (a Dynamo setting or a dynamic dimension, applied from outside the script by
``torchrepro run --fix SPEC``, :mod:`torchrepro.capture.apply_fix`), which fixes only exist as a code
change (stated, never tried), which recompiles are expected; what a fix run measured against the
baseline, and which fix to recommend. Pure: the doctor report's ``compile`` section and event
logs in, rows out; nothing here imports torch.

A fix is recommended only when its run removed recompiles or graph breaks, left the numbers the
same or within tolerance, and did not slow the steps (more than :data:`SLOWER` of the baseline's
median after warm-up, and beyond the baseline's own 90th percentile): the one that removes the most. A raised recompile limit is never
recommended: it is shown with the cost of the extra graphs, not as a cure.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field, replace
from typing import TypedDict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import Compile, GraphBreak, Step
from .compile import SIZE_GUARD, completed
from .divergence import Tolerance, first_divergence
from ..reports.doctor_report import (
    CompileFixRow,
    CompileSection,
    FixMeasure,
    FixRecommendation,
    ListedFix,
    RecompileEvent,
    TriedFix,
)
from ..reports.findings import Finding

# --only-fixes names, in the order they are tried
COMPILE_FIXES = (
    "dynamic_shapes",
    "capture_scalar_outputs",
    "capture_dynamic_output_shape_ops",
    "allow_unspec_int_on_nn_module",
    "recompile_limit",
)
WARM_STEPS = 10  # a truncated fix run goes this many steps past the baseline's last compile event
SLOWER = 0.10  # a median step time this much above the baseline's counts as slower (timer noise below)
TOLERANCE = Tolerance(rtol=1e-4, atol=1e-6)  # "within tolerance": check's comparison with this tolerance
RAISED_LIMITS = {"recompile_limit": 64, "accumulated_recompile_limit": 2048}

_INT_ATTRIBUTE = re.compile(r"^(?:self|L\['self'\])\.(\w+) == -?\d+$")
_ITEM = re.compile(r"item\(\)|Tensor\.item|scalar output", re.I)
_DYNAMIC_OUTPUT = re.compile(r"nonzero|dynamic shape operator|data-dependent output shape", re.I)


@dataclass
class CompileFix:
    """One mechanical fix: the ``--fix`` spec its run applies, what it is aimed at, the exact line
    that makes it permanent, and how many of the baseline's recompiles and graph breaks it should
    remove (``cure``: False for a raised limit, which removes none)."""

    name: str
    spec: str
    applied_to: str
    line: str
    removes: int
    cure: bool = True


class CodeChange(TypedDict):
    """A fix that only a change of the script makes: its name, where, and what to change."""

    name: str
    applied_to: str
    line: str


class ExpectedRecompiles(TypedDict):
    """Recompiles that are expected (evaluation graphs): not a problem to fix."""

    name: str
    applied_to: str
    count: int


@dataclass
class FixPlan:
    """What ``doctor --fixes`` does with a run: fixes to try, fixes that are only a code change
    (rows with status ``not_tried``), recompiles that are expected (status ``expected``)."""

    candidates: list[CompileFix] = field(default_factory=list)
    code_only: list[CodeChange] = field(default_factory=list)
    expected: list[ExpectedRecompiles] = field(default_factory=list)


def _source(name: str) -> str | None:
    return f"L['{name}']" if name.isidentifier() and not name.startswith("___") else None


def plan_fixes(compile_section: CompileSection) -> FixPlan:
    """The fixes for a doctor report's ``compile`` section.

    >>> section = {"recompile_events": [{"category": "shape", "function": "f",
    ...     "guard": "tensor 'x' size mismatch at index 0. expected 4, actual 2"}],
    ...     "graph_break_events": [], "recompile_limit_hits": []}
    >>> [(c.name, c.spec) for c in plan_fixes(section).candidates]
    [('dynamic_shapes', "dynamic_sources:L['x']:0")]
    """
    plan = FixPlan()
    events = compile_section.get("recompile_events", [])
    breaks = compile_section.get("graph_break_events", [])
    stack = [e for e in events if "___stack" in e["guard"]]  # values carried over a graph break
    _shape_fixes(plan, [e for e in events if e["category"] == "shape" and e not in stack])
    for name, pattern, line, code, what in (
        (
            "capture_scalar_outputs",
            _ITEM,
            "torch._dynamo.config.capture_scalar_outputs = True",
            "item_outside_compiled_code",
            "move .item() out of the compiled region (return the tensor; call .item() after the step)",
        ),
        (
            "capture_dynamic_output_shape_ops",
            _DYNAMIC_OUTPUT,
            "torch._dynamo.config.capture_dynamic_output_shape_ops = True",
            "no_boolean_mask",
            "replace boolean-mask indexing with torch.where or a masked op",
        ),
    ):
        hit = [b for b in breaks if pattern.search(b["reason"])]
        if not hit:
            continue
        where = ", ".join(sorted({b["file"].rsplit("/", 1)[-1] + f":{b['line']}" for b in hit if b["file"]}))
        carried, stack = stack, []  # recompiles on a carried value go with the first break removed
        removes = sum(b["count"] for b in hit) + len(carried)
        plan.candidates.append(CompileFix(name, name, f"graph break at {where or 'the compiled code'}", line, removes))
        plan.code_only.append({"name": code, "applied_to": where, "line": what})
    attributes = [e for e in events if e["category"] == "module_attribute" and _INT_ATTRIBUTE.match(e["guard"])]
    if attributes:
        names = sorted({m.group(1) for e in attributes if (m := _INT_ATTRIBUTE.match(e["guard"]))})
        plan.candidates.append(
            CompileFix(
                "allow_unspec_int_on_nn_module",
                "allow_unspec_int_on_nn_module",
                "int module attribute " + ", ".join(f"self.{n}" for n in names),
                "torch._dynamo.config.allow_unspec_int_on_nn_module = True",
                # the attribute turns dynamic on its second value: one recompile each stays
                max(0, len(attributes) - len(names)),
            )
        )
    hits = compile_section.get("recompile_limit_hits", [])
    if hits:
        limit = hits[0].get("limit") or "recompile_limit"
        value = RAISED_LIMITS.get(limit, 64)
        plan.candidates.append(
            CompileFix(
                "recompile_limit",
                f"{limit}:{value}",
                f"{limit} (hit {len(hits)}x in {hits[0]['function']})",
                f"torch._dynamo.config.{limit} = {value}",
                0,
                cure=False,
            )
        )
    for label, rows in (
        (
            "graphs with and without gradients",
            [e for e in events if e.get("evaluation") and e["category"] == "grad_mode"],
        ),
        ("train() and eval() graphs", [e for e in events if e.get("evaluation") and e["category"] != "grad_mode"]),
    ):
        if rows:
            functions = sorted({e["function"] for e in rows})
            plan.expected.append({"name": label, "applied_to": ", ".join(functions), "count": len(rows)})
    return plan


def _shape_fixes(plan: FixPlan, events: list[RecompileEvent]) -> None:
    """Dynamic dimensions for shape recompiles: the dimension each guard names, by source
    (``dynamic_sources``, what ``mark_dynamic`` does); every dimension (``dynamic=True``) when a
    guard names none. A shrunk leading dimension is a short last batch: ``drop_last=True``, a code change."""
    if not events:
        return
    named = [(m, e) for e in events for m in [SIZE_GUARD.match(e["guard"])]]
    entries = sorted({f"{_source(m.group(1))}:{m.group(2)}" for m, _ in named if m and _source(m.group(1))})
    if entries and all(m and _source(m.group(1)) for m, _ in named):
        dims = ", ".join(f"{m.group(1)} dim {m.group(2)}" for m in {m.group(1, 2): m for m, _ in named if m}.values())
        functions = ", ".join(sorted({e["function"] for e in events}))
        fix = CompileFix(
            "dynamic_shapes",
            "dynamic_sources:" + ",".join(entries),
            f"{dims} ({functions})",
            f'torch.compiler.config.dynamic_sources = "{",".join(entries)}"',
            len(events),
        )
    else:
        fix = CompileFix(
            "dynamic_shapes", "dynamic", "every dimension", "torch.compile(..., dynamic=True)", len(events)
        )
    plan.candidates.append(fix)
    if any(m and m.group(2) == "0" and int(m.group(4)) < int(m.group(3)) for m, _ in named):
        plan.code_only.append(
            {"name": "drop_last", "applied_to": "the DataLoader", "line": "DataLoader(..., drop_last=True)"}
        )


def window(logs: list[EventLog]) -> int | None:
    """The step a fix run can stop after: :data:`WARM_STEPS` past the baseline's last compile or
    graph break; None (run it all) when the baseline has no steps or ends before that."""
    steps = [s.index for log in logs for s in log.of(Step)]
    if not steps:
        return None
    marks = [e.step for log in logs for e in log.events if isinstance(e, (Compile, GraphBreak)) and e.step is not None]
    stop = max(marks, default=0) + WARM_STEPS
    return stop if stop < max(steps) else None


def measure(logs: list[EventLog], until: int | None = None) -> FixMeasure:
    """A run's compile health up to step ``until`` (all: None), counted as ``doctor`` counts
    (:func:`torchrepro.analysis.compile.summarize`): compiles, recompiles, graph breaks,
    recompile-limit hits, compile time; and the median and 90th-percentile step time on rank 0
    after warm-up (leaving out step 0 and every step that compiled)."""

    def within(step: int | None) -> bool:
        return until is None or step is None or step <= until

    compiles = [c for log in logs for c in log.of(Compile) if within(c.step)]
    done = completed(compiles)
    steps = [s for s in (logs[0].of(Step) if logs else []) if within(s.index)]
    times = sorted(s.time_s for s in steps if s.index > 0 and not s.compiles and s.time_s is not None)
    return {
        "compiles": len(done),
        "recompiles": sum(c.is_recompile for c in done),
        "graph_breaks": sum(within(b.step) for log in logs for b in log.of(GraphBreak)),
        "limit_hits": sum(bool(c.limit_hit) for c in compiles),
        "compile_time_s": round(sum(c.seconds for c in compiles), 3),
        "step_time_s": round(statistics.median(times), 6) if times else None,
        "step_time_tail_s": round(times[min(len(times) - 1, int(0.9 * len(times)))], 6) if times else None,
        "steps": len(steps),
    }


def numerics(baseline: list[EventLog], fixed: list[EventLog]) -> str:
    """The loss curve (and gradients, parameters) of a fix run against the baseline, step by step
    over the steps both recorded, by ``check``'s comparison: ``same`` bit for bit, ``within_tolerance``
    (:data:`TOLERANCE`), else ``changed``."""
    if first_divergence(baseline, fixed, Tolerance())[0] is None:
        return "same"
    return "within_tolerance" if first_divergence(baseline, fixed, TOLERANCE)[0] is None else "changed"


def _problems(m: FixMeasure) -> int:
    return m["recompiles"] + m["graph_breaks"]


def judge(fix: CompileFix, before: FixMeasure, after: FixMeasure | None, verdict: str | None) -> TriedFix:
    """A tried fix's row: ``fixed`` (removed at least what it aims at), ``partly``, ``no_effect``,
    ``worse``, ``not_a_cure`` (a raised limit), ``failed`` (its run did not end normally)."""
    removed = None if after is None else _problems(before) - _problems(after)
    if removed is None:
        status = "failed"
    elif not fix.cure:
        status = "not_a_cure"
    elif removed >= max(fix.removes, 1):
        status = "fixed"
    else:
        status = "partly" if removed > 0 else "no_effect" if removed == 0 else "worse"
    return {
        "name": fix.name,
        "applied_to": fix.applied_to,
        "line": fix.line,
        "spec": fix.spec,
        "before": before,
        "after": after,
        "numerics": verdict,
        "expected_removed": fix.removes,
        "status": status,
        "removed": removed,
    }


def slower(before: FixMeasure, after: FixMeasure) -> bool:
    """The fix run's median step time is above both the baseline's median by :data:`SLOWER` and the
    baseline's own 90th percentile: beyond the noise of the baseline's steps (a busy machine's
    timer noise is not a cost).

    >>> slower({"step_time_s": 0.10, "step_time_tail_s": 0.15}, {"step_time_s": 0.13})
    False
    >>> slower({"step_time_s": 0.10, "step_time_tail_s": 0.15}, {"step_time_s": 0.16})
    True
    """
    median, tail, then = before["step_time_s"], before.get("step_time_tail_s"), after["step_time_s"]
    if median is None or then is None:
        return False
    return bool(then > median * (1 + SLOWER) and then > (tail or median))


def recommendable(rows: list[TriedFix]) -> list[TriedFix]:
    """The tried fixes that removed recompiles or breaks without changing the numbers or slowing
    the steps, most removed first (ties: the order tried)."""
    good = [
        r
        for r in rows
        if r["status"] in ("fixed", "partly")
        and r["numerics"] in ("same", "within_tolerance")
        and r["after"] is not None
        and not slower(r["before"], r["after"])
    ]
    return sorted(good, key=lambda r: -(r["removed"] or 0))  # a fixed or partly row removed some


def recommend(rows: list[TriedFix], combined: TriedFix | None = None) -> FixRecommendation | None:
    """``compile_fix_recommended``: the best fix and its line; with the recommended set (every
    recommendable fix) and, when there were several, how they did tried together. None when no
    fix qualifies."""
    good = recommendable(rows)
    if not good:
        return None
    best = good[0]
    return {
        "name": best["name"],
        "applied_to": best["applied_to"],
        "line": best["line"],
        "removed": best["removed"],
        "set": [r["name"] for r in good],
        "lines": [r["line"] for r in good],
        "combined": combined,
    }


def listed(plan: FixPlan) -> list[ListedFix]:
    """The rows of fixes not run: code changes (``not_tried``) and expected recompiles (``expected``)."""
    rows: list[ListedFix] = [
        {
            **c,
            "before": None,
            "after": None,
            "numerics": None,
            "status": "not_tried",
            "note": "a code change: not tried",
        }
        for c in plan.code_only
    ]
    return rows + [
        {
            "name": e["name"],
            "applied_to": e["applied_to"],
            "before": None,
            "after": None,
            "numerics": None,
            "status": "expected",
            "note": f"{e['count']} recompile(s): expected, not a problem to fix",
        }
        for e in plan.expected
    ]


# The findings a fix answers (their code, and the setting their hint names, when not every finding of the
# code is the fix's), and what to change when its run shows it does not work here
_ANSWERS: dict[str, tuple[str, str | None, str]] = {
    "dynamic_shapes": (
        "RECOMPILE_SHAPE",
        None,
        "Keep the shape the same instead: pad or bucket it to a few sizes (drop_last=True for a short last "
        "batch); TORCH_LOGS=recompiles_verbose names every guard that failed.",
    ),
    "capture_scalar_outputs": (
        "GRAPH_BREAK",
        "capture_scalar_outputs",
        "Move .item() out of the compiled region instead (return the tensor; call .item() after the step).",
    ),
    "capture_dynamic_output_shape_ops": (
        "GRAPH_BREAK",
        "capture_dynamic_output_shape_ops",
        "Replace the boolean-mask indexing with torch.where or a masked op instead.",
    ),
    "allow_unspec_int_on_nn_module": (
        "RECOMPILE_MODULE_ATTRIBUTE",
        "allow_unspec_int_on_nn_module",
        "Keep the value in a tensor buffer, or set the attribute once before compiling, instead.",
    ),
}


def _outcome(row: TriedFix) -> str:
    """What the fix run measured, in words."""
    before, after = row["before"], row["after"]
    if after is None:
        return "was tried, and its run did not end normally"
    counts = (
        f"{_problems(before)} recompile(s) and graph break(s) before, {_problems(after)} after, "
        f"numbers {row['numerics'] or 'not compared'}"
    )
    if row["status"] == "no_effect":
        return f"was tried and had no effect ({counts})"
    if row["status"] == "worse":
        return f"was tried and made it worse ({counts})"
    if row["numerics"] == "changed":
        return f"was tried and changed the numbers ({counts})"
    if slower(before, after):
        return f"was tried and slowed the steps ({counts}; median step {before['step_time_s']} s → {after['step_time_s']} s)"
    return f"was tried and removed {row['removed']} ({counts})"


def advise(findings: list[Finding], rows: list[CompileFixRow] | None) -> list[Finding]:
    """``findings`` with the advice of every one a tried fix answers (:data:`_ANSWERS`) brought in line
    with what its run measured: a fix that works is said to, measured; one that had no effect, made it
    worse, changed the numbers or slowed the steps is no longer advised, and the change that remains is.
    One account of each fact: the finding and the fix table never disagree.

    >>> name = "allow_unspec_int_on_nn_module"
    >>> row = {"name": name, "spec": name, "line": f"torch._dynamo.config.{name} = True", "status": "no_effect",
    ...        "removed": 0, "numerics": "same", "before": {"recompiles": 1, "graph_breaks": 0},
    ...        "after": {"recompiles": 1, "graph_breaks": 0}}
    >>> found = Finding("RECOMPILE_MODULE_ATTRIBUTE", "warning", "m", hint="... set allow_unspec_int_on_nn_module ...")
    >>> advise([found], [row])[0].hint.startswith("Measured by doctor --fixes: torch._dynamo.config.allow_unspec")
    True
    """
    tried = {r["name"]: r for r in rows or [] if r["name"] in _ANSWERS and r.get("spec")}
    out = []
    for finding in findings:
        earlier = finding.evidence.get("fix_measured")
        if isinstance(earlier, dict):  # advised before (a resumed doctor --fixes): from the advice unmeasured
            finding = replace(finding, hint=str(earlier["unmeasured_hint"]))
        row = next(
            (
                r
                for name, r in tried.items()
                if finding.code == _ANSWERS[name][0] and (_ANSWERS[name][1] or "") in finding.hint
            ),
            None,
        )
        if row is None:
            out.append(finding)
            continue
        tried_row: TriedFix = row  # type: ignore[assignment]  # a row with a spec was run
        measured = f"Measured by doctor --fixes: {tried_row['line']} {_outcome(tried_row)}."
        works = tried_row in recommendable([tried_row])
        hint = f"{finding.hint} {measured}" if works else f"{measured} {_ANSWERS[tried_row['name']][2]}"
        measure = {"name": tried_row["name"], "status": tried_row["status"], "unmeasured_hint": finding.hint}
        evidence = {**finding.evidence, "fix_measured": measure}
        out.append(replace(finding, hint=hint, evidence=evidence))
    return out
