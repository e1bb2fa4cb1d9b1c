"""The golden report (``torchrepro golden check``): a new run of a script judged against a golden
run stored earlier (docs/golden.md): ``bit_exact``, ``within_band`` (not bit for bit, within the
golden's own run-to-run band), ``diverged`` (with where and why), or ``not_comparable`` (recorded
under another torch, device or world size: what differs, and which verdict is still possible)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, TypedDict

from ..eventlog.golden_dir import GoldenEnvironment
from ..eventlog.jsoncheck import schema_problem
from ..eventlog.payloads import JsonObject
from .check_report import CheckReport
from .findings import Finding, Verdict, load_findings
from .schema import SCHEMAS, schema_of


class EnvironmentDifference(TypedDict):
    """One way this run's environment is not the golden's: ``what`` (``torch_version``, ``device``,
    ``world_size``), as recorded and as here."""

    what: str
    recorded: str
    here: str


@dataclass
class GoldenReport:
    """``torchrepro golden check``. ``golden``: the golden directory; ``recorded`` and ``here``: the
    environments compared; ``differences`` between them and ``still_possible`` (what could still be
    judged, and how); ``check``: the bit-for-bit comparison of the golden's reference run with this
    run (``torchrepro diff``'s report; None when nothing was run); ``band``: this run against the
    golden's run-to-run band (``torchrepro compare``'s section; None when not consulted);
    ``run_dir``: where this run was stored."""

    kind: ClassVar[str] = "golden"
    golden: str
    verdict: Verdict
    verdict_line: str
    recorded: GoldenEnvironment
    here: GoldenEnvironment
    differences: list[EnvironmentDifference] = field(default_factory=list)
    still_possible: str | None = None
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    run_dir: str | None = None
    check: CheckReport | None = None
    band: JsonObject | None = None

    @property
    def exit_code(self) -> int:
        """2 when the golden's log cannot be read, 3 when this run did not end normally, else 0 for
        ``bit_exact``/``within_band`` and 1 otherwise (``diverged``, ``not_comparable``)."""
        if self.check is not None and self.verdict is not Verdict.NOT_COMPARABLE:
            det = self.check.determinism
            if any(e.unreadable for e in det.endings):
                return 2
            if not all(e.ended_normally for e in det.endings) or self.verdict is Verdict.INCOMPLETE:
                return 3
        return 0 if self.verdict.passing else 1

    def to_json(self) -> JsonObject:
        """The ``report.json`` document."""
        return {
            "schema": SCHEMAS["golden"],
            "kind": "golden",
            "golden": self.golden,
            "verdict": self.verdict_line,
            "golden_verdict": self.verdict.value,
            "exit_code": self.exit_code,
            "recorded": dict(self.recorded),
            "here": dict(self.here),
            "differences": list(self.differences),
            "still_possible": self.still_possible,
            "findings": [f.to_json() for f in self.findings],
            "notes": self.notes,
            "run_dir": self.run_dir,
            "check": self.check.to_json() if self.check is not None else None,
            "band": self.band,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> GoldenReport:
        """Read a ``report.json`` document of this kind (:func:`load_report` checks the schema; the check
        report it holds is checked against the check schema here)."""
        if data["check"] is not None and (problem := schema_problem(data["check"], schema_of("check"))) is not None:
            raise ValueError(f"its check report: {problem}")
        return cls(
            golden=data["golden"],
            verdict=Verdict(data["golden_verdict"]),
            verdict_line=data["verdict"],
            recorded=data["recorded"],
            here=data["here"],
            differences=data["differences"],
            still_possible=data["still_possible"],
            findings=load_findings(data["findings"]),
            notes=data["notes"],
            run_dir=data["run_dir"],
            check=CheckReport.from_json(data["check"]) if data["check"] is not None else None,
            band=data["band"],
        )
