"""What the wheel ships: the type marker (PEP 561), the start-up hook, the schemas and templates."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_ships_py_typed_and_the_package_data(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, ROOT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode:
        pytest.skip(f"cannot build a wheel here: {build.stderr.strip().splitlines()[-1:]}")
    (wheel,) = tmp_path.glob("torchrepro-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "torchrepro/py.typed" in names
    assert "torchrepro/runtime/_bootstrap/sitecustomize.py" in names
    assert {"torchrepro/schemas/doctor.schema.json", "torchrepro/schemas/drift.schema.json"} <= names
    assert "torchrepro/report/templates/doctor.html.j2" in names
    assert not [n for n in names if n.startswith("torchrepro/") and "__pycache__" in n]
