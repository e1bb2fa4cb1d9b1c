"""Values that are not finite: a loss, a gradient norm or a parameter holding NaN or an infinity,
and parameters a run never initialised (``Module.to_empty()`` gave them memory and nothing wrote it
before the first forward) — the findings ``doctor``, ``check`` and ``compare`` report, from events.
Nothing here imports torch.

A run's first non-finite loss and gradient norm come from its steps (per rank, the first step
whose value is NaN or infinite); which gradients and parameters hold them from the ``nonfinite``
events capture writes the first time it sees them; the parameters left unwritten from the
``init_params`` event of the first forward.

>>> from pathlib import Path
>>> from torchrepro.eventlog.event_reader import EventLog
>>> from torchrepro.eventlog.events import Step
>>> log = EventLog(Path("rank-0/events.jsonl"), [Step(index=0, loss=2.0), Step(index=1, loss=float("nan"))])
>>> [f.title for f in nonfinite_findings([log])]
['the loss is NaN at step 1 (rank 0), the first that is not finite']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..eventlog.event_reader import EventLog
from ..eventlog.events import InitParams, NonFinite
from ..eventlog.payloads import JsonObject
from ..reports.findings import Finding
from .kept_steps import KeptSteps, kept_steps

# the codes, in the order a run meets them: what it starts from, then what a step computes
CODES = ("UNINITIALISED_PARAMETERS", "NONFINITE_PARAMETER", "NONFINITE_GRAD", "NONFINITE_LOSS")
_SHOWN = 3  # names in a finding's title

UNINITIALISED_HINT = (
    "to_empty() gives parameters memory without writing it: whatever it held is what they train from. "
    "Initialise every parameter after to_empty(): call reset_parameters() on every submodule that has one "
    "(for m in model.modules(): if hasattr(m, 'reset_parameters'): m.reset_parameters() — a model's own "
    "reset_parameters() often leaves its blocks out), or load a state dict into it (with FSDP2: "
    "set_model_state_dict(model, full_state_dict, options=StateDictOptions(full_state_dict=True, "
    "broadcast_from_rank0=True)))."
)
_FIND_THE_OP = (
    "Run the first such step under torch.autograd.detect_anomaly() to name the op that makes the first NaN; "
    "usual causes: a learning rate too large, log/sqrt/division of values that reach zero or below, float16 "
    "overflow without torch.amp.GradScaler."
)


def value_text(x: float) -> str:
    """``NaN``, ``inf`` or ``-inf`` (a finite value as it is)."""
    return "NaN" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:.6g}"


@dataclass
class _Seen:
    """Where one kind of non-finite value first shows: per rank that holds it, its first step."""

    steps: dict[int, int]

    @property
    def step(self) -> int:
        return min(self.steps.values())

    @property
    def first_ranks(self) -> list[int]:
        return sorted(r for r, step in self.steps.items() if step == self.step)

    @property
    def rank(self) -> int:
        return self.first_ranks[0]

    def where(self) -> str:
        ranks = self.first_ranks
        return f"step {self.step} ({'rank' if len(ranks) == 1 else 'ranks'} {_ranks_text(ranks)})"

    def evidence(self) -> JsonObject:
        return {
            "step": self.step,
            "rank": self.rank,
            "ranks": self.first_ranks,
            "first_step_per_rank": {str(r): step for r, step in sorted(self.steps.items())},
        }


def _ranks_text(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks[:8])) + (f" … ({len(ranks)} ranks)" if len(ranks) > 8 else "")


def _names_text(names: Sequence[str], count: int) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {count - _SHOWN} more" if count > _SHOWN else "")


def _module(name: str) -> str:
    """The module that holds a parameter (``layers.0.attention`` for ``layers.0.attention.wq.weight``)."""
    return name.rpartition(".")[0] or "<root>"


def nonfinite_findings(logs: list[EventLog], kept: dict[int, KeptSteps] | None = None) -> list[Finding]:
    """``UNINITIALISED_PARAMETERS``, ``NONFINITE_PARAMETER``, ``NONFINITE_GRAD`` and ``NONFINITE_LOSS``
    of one run's ranks (``kept``: their steps as the doctor report reduced them; else reduced here)."""
    kept = kept if kept is not None else kept_steps(logs)
    inits: dict[int, InitParams] = {}
    tensors: dict[str, dict[int, NonFinite]] = {"parameters": {}, "gradients": {}}
    for log in logs:
        init = next((e for e in log.of(InitParams) if e.source == "first_forward"), None)
        if init is not None and init.unwritten:
            inits[log.rank] = init
        for event in log.of(NonFinite):
            tensors.get(event.what, {}).setdefault(log.rank, event)
    losses = {r: k.nonfinite_loss for r, k in kept.items() if k.nonfinite_loss is not None}
    norms = {r: k.nonfinite_grad_norm for r, k in kept.items() if k.nonfinite_grad_norm is not None}
    out = []
    if inits:
        out.append(_uninitialised(inits))
    if tensors["parameters"]:
        out.append(_parameters(tensors["parameters"], inits))
    if norms or tensors["gradients"]:
        out.append(_gradients(norms, tensors["gradients"], min((step for step, _ in losses.values()), default=None)))
    if losses:
        out.append(_loss(losses, bool(inits or tensors["parameters"])))
    return out


def _uninitialised(inits: dict[int, InitParams]) -> Finding:
    seen = _Seen({r: e.step or 0 for r, e in inits.items()})
    first = inits[seen.rank]
    names, ranks = first.unwritten, sorted(inits)
    return Finding(
        "UNINITIALISED_PARAMETERS",
        "error",
        f"{len(names)} of {len(first.names)} parameters of {first.module or 'the model'} were never initialised: "
        f"to_empty() materialised them and nothing wrote them before the first forward "
        f"({_names_text(names, len(names))}; {'rank' if len(ranks) == 1 else 'ranks'} {_ranks_text(ranks)}): "
        "the model trains on uninitialised memory",
        hint=UNINITIALISED_HINT,
        evidence={
            **seen.evidence(),
            "ranks": ranks,
            "module": first.module or None,
            "tensor": names[0],
            "parameters": names[:20],
            "count": len(names),
            "of": len(first.names),
            "modules": list(dict.fromkeys(map(_module, names)))[:20],
        },
    )


def _tensors(first: NonFinite, key: str) -> JsonObject:
    return {
        "tensor": first.names[0],
        "module": _module(first.names[0]),
        key: first.names,
        "count": first.count,
        "of": first.of,
    }


def _parameters(events: dict[int, NonFinite], inits: dict[int, InitParams]) -> Finding:
    seen = _Seen({r: e.step or 0 for r, e in events.items()})
    first = events[seen.rank]
    uninitialised = seen.rank in inits and set(first.names) <= set(inits[seen.rank].unwritten)
    return Finding(
        "NONFINITE_PARAMETER",
        "error",
        f"{first.count} of {first.of} parameters hold NaN or inf as training starts, at {seen.where()}: "
        f"{_names_text(first.names, first.count)}",
        hint="They were never initialised: initialise them after to_empty() (UNINITIALISED_PARAMETERS says how)."
        if uninitialised
        else "Whatever set them wrote NaN or inf: check their initialisation, or the checkpoint they were loaded from.",
        evidence={**seen.evidence(), **_tensors(first, "parameters")},
    )


def _gradients(norms: dict[int, tuple[int, float]], events: dict[int, NonFinite], loss_step: int | None) -> Finding:
    seen = _Seen({r: step for r, (step, _) in norms.items()} or {r: e.step or 0 for r, e in events.items()})
    first = events.get(seen.rank)
    value = norms[seen.rank][1] if seen.rank in norms else math.nan
    which = (
        f": {first.count} of {first.of} gradients are not finite, first {_names_text(first.names, first.count)}"
        if first is not None
        else ""
    )
    return Finding(
        "NONFINITE_GRAD",
        "error",
        f"the gradient norm is {value_text(value)} at {seen.where()}, the first that is not finite{which}",
        hint="The optimizer steps with these gradients and writes NaN or inf into the parameters. "
        + (
            "The loss is not finite already (NONFINITE_LOSS): find where it first is."
            if loss_step is not None and loss_step <= seen.step
            else _FIND_THE_OP
        ),
        evidence={**seen.evidence(), "value": value_text(value), **(_tensors(first, "gradients") if first else {})},
    )


def _loss(losses: dict[int, tuple[int, float]], from_parameters: bool) -> Finding:
    seen = _Seen({r: step for r, (step, _) in losses.items()})
    value = losses[seen.rank][1]
    return Finding(
        "NONFINITE_LOSS",
        "error",
        f"the loss is {value_text(value)} at {seen.where()}, the first that is not finite",
        hint="Its parameters were never initialised or held NaN or inf from the start "
        "(UNINITIALISED_PARAMETERS, NONFINITE_PARAMETER): fix those first."
        if from_parameters
        else _FIND_THE_OP,
        evidence={**seen.evidence(), "value": value_text(value)},
    )


def of_runs(findings: dict[str, list[Finding]]) -> list[Finding]:
    """The findings of several runs (by label) as one list: a finding every run has alike once, with
    the runs in its evidence; the others each with its run's label before its title."""
    labels = list(findings)
    out: list[Finding] = []
    for label, found in findings.items():
        for f in found:
            alike = [other for other in labels if any(_same(f, g) for g in findings[other])]
            if len(alike) == len(labels):
                if label == labels[0]:
                    out.append(Finding(f.code, f.severity, f.title, f.hint, {**f.evidence, "runs": labels}))
                continue
            out.append(Finding(f.code, f.severity, f"{label}: {f.title}", f.hint, {**f.evidence, "runs": [label]}))
    return out


def _same(a: Finding, b: Finding) -> bool:
    return (a.code, a.title, a.evidence) == (b.code, b.title, b.evidence)
