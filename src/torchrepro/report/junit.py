"""JUnit XML for CI systems: one test case per budget and one per error finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET


def write_junit(report: dict[str, Any], path: Path) -> None:
    """Write ``report`` as a JUnit test suite (budgets and error findings fail)."""
    suite = ET.Element("testsuite", name="torchrepro")
    cases = [("budgets", report.get("budget_failures", []))]
    cases += [(f["code"], [f["title"]]) for f in report["findings"] if f["severity"] == "error"]
    failures = 0
    for name, problems in cases:
        case = ET.SubElement(suite, "testcase", classname="torchrepro.doctor", name=name)
        if problems:
            failures += 1
            failure = ET.SubElement(case, "failure", message=problems[0])
            failure.text = "\n".join(problems)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(failures))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
