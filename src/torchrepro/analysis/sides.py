"""Two runs next to each other, for ``check``, ``check-resume`` and ``diff`` reports: what each run
was (provenance, how it ended) and, step by step, how far their losses and parameters are apart.
Nothing here imports torch.
"""

from __future__ import annotations

from ..eventlog.event_reader import EventLog
from ..eventlog.events import Step
from ..eventlog.provenance import provenance
from ..eventlog.payloads import JsonObject
from ..reports.check_report import RunSide, StepRow
from .divergence import distance
from .kept_steps import MAX_POINTS


def side(label: str, path: str, meta: JsonObject, logs: list[EventLog]) -> RunSide:
    """One run of a comparison: label, directory, provenance, per-rank ends and loss range."""
    steps = logs[0].of(Step) if logs else []
    losses = [s.loss for s in steps if s.loss is not None]
    return {
        "label": label,
        "path": path,
        "provenance": provenance(meta, logs[0].header if logs else None),
        "compile_mode": meta.get("compile_mode"),
        "exit_code": meta.get("exit_code"),
        "ranks": [log.rank for log in logs],
        "steps": len(steps),
        "status": {str(log.rank): (log.end.status if log.end else "incomplete") for log in logs},
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
    }


def step_comparison(a: EventLog, b: EventLog) -> list[StepRow]:
    """Per step both runs recorded (one rank): the two losses, their absolute difference (0 for the
    same bits, NaN and infinities included; :func:`~.divergence.distance`) and
    whether the parameter fingerprints after the step are equal (None where not fingerprinted)."""
    by_index = {s.index: s for s in b.of(Step)}
    rows: list[StepRow] = []
    for x in a.of(Step):
        y = by_index.get(x.index)
        if y is None:
            continue
        same = None if x.params_fp is None or y.params_fp is None else x.params_fp == y.params_fp
        rows.append(
            {
                "step": x.index,
                "loss_a": x.loss,
                "loss_b": y.loss,
                "loss_diff": distance(x.loss, y.loss) if x.loss is not None and y.loss is not None else None,
                "same_params": same,
            }
        )
    if len(rows) > MAX_POINTS:
        stride = len(rows) / MAX_POINTS
        first_diff = next((i for i, r in enumerate(rows) if r["same_params"] is False or r["loss_diff"]), None)
        keep = {int(i * stride) for i in range(MAX_POINTS)} | {first_diff, len(rows) - 1}
        rows = [r for i, r in enumerate(rows) if i in keep]
    return rows
