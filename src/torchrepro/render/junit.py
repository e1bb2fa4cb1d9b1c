"""JUnit XML for CI systems, from any report that reaches a verdict: one test case per thing the
report judged, failing with what the report says of it; the body of every failure starts with
the report's verdict line. Read from the typed report; nothing is computed here.

- doctor (``doctor``, ``report``): the budgets, and each error finding;
- a comparison of runs (``check``, ``check-resume``, ``diff``): whether the runs agree, and how
  each run ended;
- ``compare``: whether configuration B stays in configuration A's band, and how each run ended;
- ``golden check``: whether the run matches the golden run, and how each compared run ended;
- ``drift``: each binary factor (fails when it makes a real difference), and each run left out
  of every statistic (fails when it crashed; skipped when it gave no metric).

Text from the user's script is escaped, control characters included, so the file is always
well-formed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from xml.etree import ElementTree as ET

from .sanitize import visible
from ..reports.check_report import CheckReport, RunEnding
from ..reports.compare_report import CompareReport
from ..reports.doctor_report import DoctorReport
from ..reports.drift_report import DriftReport
from ..reports.findings import Verdict
from ..reports.golden_report import GoldenReport
from ..reports.loader import Report


@dataclass(frozen=True)
class _Case:
    """One thing judged: its name and, when it fails, what is wrong (the first line is the message)."""

    name: str
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None


def junit_xml(report: Report) -> bytes:
    """``report`` as a JUnit test suite (``torchrepro.<kind>``), one test case per thing judged.

    >>> from xml.etree import ElementTree as ET
    >>> from torchrepro.reports.findings import Verdict
    >>> from torchrepro.reports.check_report import CheckReport, CheckRun, Determinism, RunEnding
    >>> runs = [RunEnding("run-1", True), RunEnding("run-2", False, ["exit code 1"])]
    >>> report = CheckReport(CheckRun({}), Determinism(Verdict.INCOMPLETE, ["run-1", "run-2"], 3, runs), [], "INCOMPLETE")
    >>> suite = ET.fromstring(junit_xml(report))
    >>> [(c.get("name"), c.find("failure") is not None) for c in suite]
    [('run-1 vs run-2', False), ('run-1 ended normally', False), ('run-2 ended normally', True)]
    """
    kind, cases = _cases(report)
    suite = ET.Element("testsuite", name="torchrepro" if kind == "doctor" else f"torchrepro {kind}")
    failures = 0
    for case in cases:
        element = ET.SubElement(suite, "testcase", classname=f"torchrepro.{kind}", name=visible(case.name))
        if case.skipped is not None:
            ET.SubElement(element, "skipped", message=visible(case.skipped))
        elif case.problems:
            failures += 1
            failure = ET.SubElement(element, "failure", message=visible(case.problems[0]))
            failure.text = visible("\n".join([report.verdict_line, *case.problems]), newlines=True)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    return bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))


def _cases(report: Report) -> tuple[str, list[_Case]]:
    """The report's kind and what it judged."""
    if isinstance(report, DoctorReport):
        errors = [_Case(f.code, [f.title]) for f in report.findings if f.severity == "error"]
        return "doctor", [_Case("budgets", report.budget_failures), *errors]
    if isinstance(report, CompareReport):
        section = report.compare
        judged = _Case("B within A's run-to-run band", _unless_agreed(report))
        return "compare", [judged, *_endings(RunEnding(**e) for e in section.get("endings", []))]
    if isinstance(report, CheckReport):
        d = report.determinism
        judged = _Case(" vs ".join(d.runs) or "runs", _unless_agreed(report))
        return "check", [judged, *_endings(d.endings)]
    if isinstance(report, GoldenReport):
        judged = _Case(f"matches golden {report.golden}", _unless_agreed(report))
        return "golden", [judged, *_endings(report.check.determinism.endings if report.check else [])]
    return "drift", _drift_cases(report)


def _unless_agreed(report: CheckReport | CompareReport | GoldenReport) -> list[str]:
    """The verdict line, unless the compared runs agree (``incomplete``: they agree as far as
    compared, and a run's own case says how it ended)."""
    return [] if report.verdict.passing or report.verdict == Verdict.INCOMPLETE else [report.verdict_line]


def _endings(endings: Iterable[RunEnding]) -> list[_Case]:
    return [
        _Case(f"{e.run} ended normally", list(e.problems) or ([] if e.ended_normally else ["did not end normally"]))
        for e in endings
    ]


def _drift_cases(report: DriftReport) -> list[_Case]:
    """Each binary factor (by its sequential decision under ``--until-clear``), each run that failed."""
    drift = report.drift
    decided = {f["factor"]: f["decision"] for f in drift.sequential["factors"]} if drift.sequential else None
    cases = []
    for effect in drift.effects:
        real = decided.get(effect.factor) == "difference" if decided is not None else effect.real
        said = f"{effect.factor} makes a real difference: {_g(effect.difference)} (p = {_g(effect.p_value)})"
        cases.append(_Case(f"{effect.factor} makes no real difference", [said] if real else []))
    for run in drift.excluded:
        what = f"{run.status}: {run.error}" if run.error else run.status
        crashed = run.status == "crashed"
        cases.append(_Case(f"run {run.index} ({run.dir})", [what] if crashed else [], None if crashed else what))
    return cases or [_Case("drift", [] if report.exit_code == 0 else [report.verdict_line])]


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
