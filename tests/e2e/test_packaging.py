"""What the built wheel ships: the PEP 561 marker that lets type checkers read torchrepro's annotations."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_ships_py_typed(tmp_path):
    # built from a copy: setuptools leaves build/ and *.egg-info in the tree it builds, and a stale
    # build/lib would put back in the wheel a file the sources no longer have
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(tree),
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        pytest.skip(f"the wheel could not be built here (offline, no setuptools?): {build.stderr.strip()[-300:]}")
    (wheel,) = tmp_path.glob("torchrepro-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "torchrepro/py.typed" in names
    assert "torchrepro/analysis/verdict.py" in names  # the marker covers the sub-packages below it
