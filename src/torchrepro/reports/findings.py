"""What every report kind shares: :class:`Finding` (one conclusion, its severity and where), the
:class:`Verdict` a report reaches with its tone and exit code, and the helpers each kind's
``from_json`` reads its dataclasses with.

>>> Verdict.BIT_EXACT.tone, Verdict("warnings").tone
('ok', 'warn')
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, TypeVar

from ..eventlog.payloads import JsonObject


SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    """One conclusion. ``code`` is stable (tests and CI match on it), ``evidence`` says where
    (ranks, steps, compile ids, source locations), ``hint`` what to change."""

    code: str
    severity: str
    title: str
    hint: str = ""
    evidence: JsonObject = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return asdict(self)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by code, keeping the original order within a code."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.code))


class Verdict(str, Enum):
    """Every verdict a report can reach. Doctor: ``healthy``, ``warnings``, ``problems``,
    ``fails_budget``; a comparison of runs (:mod:`torchrepro.analysis.verdict`): ``bit_exact``,
    ``within_tolerance``, ``diverged``, ``incomplete``, ``nothing_compared``; drift:
    ``noise`` (no factor makes a real difference), ``real_difference``, ``run_failed``; golden:
    ``within_band`` (not bit for bit, but within the golden's run-to-run band), ``not_comparable``
    (recorded under another torch, device or world size: nothing could be judged); any run:
    ``interrupted`` (torchrepro's supervisor ended without recording the end of the job: killed by
    SIGKILL or the OOM killer; how the job ended is unknown, so it is never healthy);
    ``nothing_observed`` (doctor: not one training step and not one compile was seen, so there is
    nothing a verdict could rest on)."""

    HEALTHY = "healthy"
    WARNINGS = "warnings"
    PROBLEMS = "problems"
    FAILS_BUDGET = "fails_budget"
    BIT_EXACT = "bit_exact"
    WITHIN_TOLERANCE = "within_tolerance"
    DIVERGED = "diverged"
    INCOMPLETE = "incomplete"
    NOTHING_COMPARED = "nothing_compared"
    NOISE = "noise"
    REAL_DIFFERENCE = "real_difference"
    RUN_FAILED = "run_failed"
    INTERRUPTED = "interrupted"
    NOTHING_OBSERVED = "nothing_observed"  # doctor: no step and no compile seen
    EQUIVALENT = "equivalent"  # compare: B within A's run-to-run band
    DIFFERENT = "different"  # compare: B leaves the band
    ABSTAIN = "abstain"  # compare: the evidence is too weak to say
    WITHIN_BAND = "within_band"  # golden check: within the golden run's run-to-run band
    NOT_COMPARABLE = "not_comparable"  # golden check: recorded under another torch, device or world size

    @property
    def passing(self) -> bool:
        """Whether a comparison with this verdict passes (exit 0 when every run ended normally)."""
        return self in (Verdict.BIT_EXACT, Verdict.WITHIN_TOLERANCE, Verdict.EQUIVALENT, Verdict.WITHIN_BAND)

    @property
    def tone(self) -> str:
        """``ok``, ``warn`` or ``bad``: how a renderer colours it."""
        if self in (Verdict.HEALTHY, Verdict.BIT_EXACT, Verdict.WITHIN_TOLERANCE, Verdict.NOISE) or self.passing:
            return "ok"
        return "warn" if self in (Verdict.WARNINGS, Verdict.ABSTAIN, Verdict.NOT_COMPARABLE) else "bad"

    @classmethod
    def of_doctor(cls, findings: list[Finding], budget_failures: list[str], interrupted: bool = False) -> Verdict:
        """A doctor report's verdict: an interrupted job, a failed budget, a run in which nothing was
        observed (its ``NOTHING_OBSERVED`` finding), then error findings, then warnings."""
        if interrupted:
            return cls.INTERRUPTED
        if budget_failures:
            return cls.FAILS_BUDGET
        if any(f.code == "NOTHING_OBSERVED" for f in findings):
            return cls.NOTHING_OBSERVED
        severities = {f.severity for f in findings}
        return cls.PROBLEMS if "error" in severities else cls.WARNINGS if "warning" in severities else cls.HEALTHY


def comparison_exit_code(verdict: Verdict, ended_normally: bool, unreadable: bool, unreadable_exit: int) -> int:
    """A comparison's exit code: ``unreadable_exit`` when a log cannot be read (2 for stored runs
    given as input, 3 for runs a check launched), 3 when a run did not end normally or the
    comparison is ``incomplete``, else 0 for a passing verdict and 1 otherwise.

    >>> comparison_exit_code(Verdict.DIVERGED, True, False, 3)
    1
    """
    if unreadable:
        return unreadable_exit
    if not ended_normally or verdict is Verdict.INCOMPLETE:
        return 3
    return 0 if verdict.passing else 1


T = TypeVar("T")


def from_fields(cls: type[T], data: JsonObject, **overrides: Any) -> T:
    """``cls`` from the keys of ``data`` it has fields for (missing ones take their defaults)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names and k not in overrides}, **overrides)


def extra_keys(cls: type, data: JsonObject, *also: str) -> JsonObject:
    """The keys of ``data`` that ``cls`` has no field for (kept, as they were, in ``meta``/``more``)."""
    names = {f.name for f in dataclasses.fields(cls)} | set(also)
    return {k: v for k, v in data.items() if k not in names}


def load_findings(items: list[JsonObject]) -> list[Finding]:
    return [from_fields(Finding, f) for f in items]
