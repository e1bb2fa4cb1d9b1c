"""Findings: what analysis concludes, with evidence and a concrete hint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    """One conclusion. ``code`` is stable (tests and CI match on it), ``evidence`` says where
    (ranks, steps, compile ids, source locations), ``hint`` what to change."""

    code: str
    severity: str
    title: str
    hint: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by code, keeping the original order within a code."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.code))
