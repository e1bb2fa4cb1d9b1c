"""The compare report (``torchrepro compare``): configuration B against configuration A's
run-to-run band."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..eventlog.payloads import JsonObject
from .check_report import CheckRun
from .findings import Finding, Verdict, comparison_exit_code, load_findings
from .schema import SCHEMAS


@dataclass
class CompareReport:
    """``torchrepro compare``: ``compare`` is the section :func:`torchrepro.analysis.equivalence.judge`
    builds (verdict ``equivalent``/``different``/``abstain``, the tolerance and band, the first point
    out of the band, each rank's first divergence, repeated batches)."""

    kind: ClassVar[str] = "compare"
    run: CheckRun
    compare: JsonObject
    findings: list[Finding]
    verdict_line: str
    provenance: JsonObject | None = None

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.compare["verdict"])

    @property
    def exit_code(self) -> int:
        """0 equivalent, 1 different or abstain, 3 when a run did not end normally (as a check's
        ``incomplete``; :func:`comparison_exit_code`)."""
        return comparison_exit_code(
            self.verdict, bool(self.compare.get("ended_normally")), bool(self.compare.get("unreadable")), 3
        )

    def to_json(self) -> JsonObject:
        """The ``report.json`` document."""
        out = {
            "schema": SCHEMAS["compare"],
            "kind": "compare",
            "run": self.run.to_json(),
            "compare": self.compare,
            "findings": [f.to_json() for f in self.findings],
            "verdict": self.verdict_line,
            "exit_code": self.exit_code,
        }
        if self.provenance is not None:
            out["provenance"] = self.provenance
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> CompareReport:
        """Read a ``report.json`` document of this kind (:func:`load_report` checks the schema)."""
        report = cls(CheckRun.from_json(data["run"]), data["compare"], load_findings(data["findings"]), data["verdict"])
        report.provenance = data.get("provenance")
        return report
