"""Golden directories: a stored run kept as the reference later runs are judged against
(``torchrepro golden``, docs/golden.md).

``GOLDEN/golden.json`` is the manifest: what was recorded (the script's name and sha256, its
arguments, the seed, the steps), with which torch, torchrepro and Python, on which device and world
size, and how large it is. Beside it the run directories themselves, in the run directory format
(:mod:`.rundir`): ``reference/`` and, when a run-to-run band was recorded, ``reference-2/``; each keeps
its ``run.json`` and every rank's event log (fingerprints of the parameters and gradients of every
step, the losses, the gradient norms, the RNG and batch digests, the environment), and parameter
snapshots only within the budget the recording was given.

A golden directory comes from someone else (a commit, an artifact): it is read with the run
directory readers' guards (regular files only, bounded sizes, each field checked against
``schemas/golden.schema.json``), its runs only at the two names above (never a path the manifest
names), and never through a symbolic link.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from ..errors import InputError
from .jsoncheck import schema_problem
from .rundir import Run, load_run, read_json_file, write_json

GOLDEN_FILE = "golden.json"
GOLDEN_SCHEMA = "torchrepro.golden-dir/1"
REFERENCE = "reference"  # the reference run
SECOND = "reference-2"  # the reference again: its run-to-run band
_SCHEMA = json.loads((Path(__file__).resolve().parent / "schemas" / "golden.schema.json").read_text())


class GoldenEnvironment(TypedDict):
    """What a golden run is comparable under: the torch version, the device (``cpu (x86_64, AVX2)``,
    ``cuda x2 (x86_64)``) and the world size. torchrepro and Python versions are kept but not compared."""

    torch_version: str
    device: str
    world_size: int


class GoldenSizes(TypedDict):
    """How large a golden directory is on disk: all its files (``bytes``), what does not grow with the
    steps (``fixed``: the manifest, ``run.json``, each rank's header, compiles and layout), what each
    step adds (``per_step``: the step logs of every run and rank) and each parameter tensor in a step
    of one rank (``per_parameter_step``), and the parameter snapshots kept."""

    bytes: int
    fixed: int
    steps: int
    parameters: int
    per_step: float
    per_parameter_step: float
    snapshot_bytes: int


class GoldenManifest(GoldenEnvironment):
    """``golden.json``: see the module docstring. ``runs``: ``["reference"]``, or with the band
    ``["reference", "reference-2"]``; ``nproc``: the ranks torchrepro launched (``world_size``: the
    ranks that logged, also those the script started itself); ``run_to_run``: the two reference runs compared (their check
    verdict line), None without the band."""

    schema: str
    recorded_at: str
    torchrepro_version: str
    python_version: str
    script: str
    script_sha256: str
    args: list[str]
    seed: int | None
    nproc: int
    steps: int
    runs: list[str]
    run_to_run: str | None
    snapshot_budget: int
    sizes: GoldenSizes


def write_manifest(directory: Path, manifest: GoldenManifest) -> None:
    """Write ``directory/golden.json`` (atomically)."""
    write_json(directory / GOLDEN_FILE, manifest)


def read_manifest(directory: Path) -> GoldenManifest:
    """``directory/golden.json``, checked against its schema; :class:`InputError` naming what is wrong
    (not a golden directory, a link, a damaged or foreign manifest)."""
    if directory.is_symlink() or (directory / GOLDEN_FILE).is_symlink():
        raise InputError(f"{directory}: a symbolic link: a golden directory is read only where it is")
    if not directory.is_dir():
        raise InputError(f"no such golden directory: {directory} (record one with torchrepro golden record)")
    path = directory / GOLDEN_FILE
    try:
        data = read_json_file(path)
    except FileNotFoundError:
        raise InputError(f"{directory} holds no {GOLDEN_FILE}: not a golden directory") from None
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != GOLDEN_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise InputError(f"{path}: not a torchrepro golden manifest (schema {schema!r})")
    if (problem := schema_problem(data, _SCHEMA)) is not None:
        raise InputError(f"{path}: {problem}")
    if data["runs"] not in ([REFERENCE], [REFERENCE, SECOND]):
        raise InputError(
            f"{path}: field 'runs' is {data['runs']!r}, not [{REFERENCE!r}] or [{REFERENCE!r}, {SECOND!r}]"
        )
    manifest: GoldenManifest = data  # type: ignore[assignment]
    return manifest


def load_golden_runs(directory: Path, manifest: GoldenManifest) -> list[Run]:
    """The golden's reference runs (``reference``, then ``reference-2`` when it has the band), read
    with :func:`~.rundir.load_run`'s guards; none of them, nor a rank folder in them, a link."""
    runs = []
    for name in manifest["runs"]:
        folder = directory / name
        linked = [p for p in (folder, *folder.glob("rank-*"), *folder.glob("rank-*/*")) if p.is_symlink()]
        if linked:
            raise InputError(f"{linked[0]}: a symbolic link in a golden directory: not read")
        runs.append(load_run(folder))
    return runs
