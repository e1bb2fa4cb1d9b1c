"""JUnit XML for CI systems: one test case per budget and one per error finding."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from .sanitize import visible
from ..reports.doctor_report import DoctorReport


def junit_xml(report: DoctorReport) -> bytes:
    """``report`` as a JUnit test suite (budgets and error findings fail). Text from the
    user's script is escaped, control characters included, so the file is always well-formed."""
    suite = ET.Element("testsuite", name="torchrepro")
    cases = [("budgets", report.budget_failures)]
    cases += [(f.code, [f.title]) for f in report.findings if f.severity == "error"]
    failures = 0
    for name, problems in cases:
        case = ET.SubElement(suite, "testcase", classname="torchrepro.doctor", name=visible(name))
        if problems:
            failures += 1
            failure = ET.SubElement(case, "failure", message=visible(problems[0]))
            failure.text = visible("\n".join(problems), newlines=True)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    return bytes(ET.tostring(suite, encoding="utf-8", xml_declaration=True))
