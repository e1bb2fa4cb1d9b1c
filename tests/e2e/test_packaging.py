"""What the built wheel ships: the PEP 561 marker that lets type checkers read torchrepro's annotations
and the JSON Schemas the package reads at run time; and a wheel built where no C compiler works: the
step codec in Python, every command still working."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(tmp_path: Path, env: dict[str, str] | None = None) -> Path:
    """The wheel of a copy of the sources (setuptools leaves build/ and *.egg-info in the tree it
    builds, and a stale build/lib would put back in the wheel a file the sources no longer have;
    the C extension built in place is left out too)."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
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
        env={**os.environ, **(env or {})},
    )
    if build.returncode != 0:
        pytest.skip(f"the wheel could not be built here (offline, no setuptools?): {build.stderr.strip()[-300:]}")
    (wheel,) = tmp_path.glob("torchrepro-*.whl")
    return wheel


def test_wheel_ships_py_typed(tmp_path):
    names = zipfile.ZipFile(build_wheel(tmp_path)).namelist()
    assert "torchrepro/py.typed" in names
    assert "torchrepro/analysis/verdict.py" in names  # the marker covers the sub-packages below it
    kinds = ("doctor", "check", "compare", "drift")
    assert {f"torchrepro/reports/schemas/{kind}.schema.json" for kind in kinds} <= set(names)  # load_report reads them
    assert "torchrepro/eventlog/schemas/run.schema.json" in names  # load_run checks run.json against it


STEPS = """\
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.ones(2, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


@pytest.mark.slow  # builds a wheel and runs a script twice: make test-slow
def test_a_wheel_built_without_a_c_compiler_works_with_the_python_codec(tmp_path):
    wheel = build_wheel(tmp_path, {"CC": "/bin/false"})  # every compile fails; the extension is optional
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("TORCHREPRO_PURE_PYTHON_CODEC", None)

    def torchrepro(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torchrepro", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=300,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import torchrepro; print(torchrepro.__file__)"], env=env, capture_output=True, text=True
    )
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr  # the wheel's, not the checkout's
    said = json.loads(torchrepro("env", "--json").stdout)
    assert said["step_codec"].startswith("Python (the C extension was not built"), said["step_codec"]
    (tmp_path / "train.py").write_text(STEPS)
    check = torchrepro("check", "--seed", "0", "--out", str(tmp_path / "check"), "train.py")
    assert check.returncode == 0 and "BIT-EXACT" in check.stdout + check.stderr, check.stdout + check.stderr
    steps = (tmp_path / "check" / "run-1" / "rank-0" / "steps.bin").read_bytes()
    assert b'"torchrepro.steps/2"' in steps.split(b"\n", 1)[0], steps[:60]  # written by the Python codec
