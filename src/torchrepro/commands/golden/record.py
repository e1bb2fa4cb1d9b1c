"""``torchrepro golden record``: run a script as ``check`` runs it (every step's parameters and
gradients fingerprinted, losses and gradient norms, RNG and batch digests), once, or twice for its
run-to-run band, and keep it as a golden directory (:mod:`torchrepro.eventlog.golden_dir`): the run
directories cut to their event logs, parameter snapshots only within a budget, and ``golden.json``.

The recording happens in a directory beside the golden one and takes its place only once it is
complete: a golden directory is never left half written, and an existing one is replaced only with
``force`` (and only if it is a golden directory)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console

from ... import __version__
from ...analysis.golden_verdict import device_of
from ...errors import InputError, ScriptFailed
from ...eventlog.events import EVENTS_FILE, Params, Step
from ...eventlog.golden_dir import (
    GOLDEN_FILE,
    GOLDEN_SCHEMA,
    REFERENCE,
    SECOND,
    GoldenManifest,
    GoldenSizes,
    write_manifest,
)
from ...eventlog.rundir import LOCK_FILE, RUN_FILE, Run, claim_run_dir, create_run_dir, disk_use, release_run_dir
from ...eventlog.stepstream import STEPS_FILE
from ...runtime.run_options import RunOptions
from ..check.runs import Checker, RunSpec
from ..launcher import validate_script

KEPT = (RUN_FILE,)  # what a golden run directory keeps at its top (and rank-*/ its event log, snapshots/)


def record_golden(
    script: Path,
    args: list[str],
    out: Path,
    *,
    options: RunOptions,
    band: bool = False,
    snapshot_budget: int = 0,
    nproc: int = 1,
    timeout: float | None = None,
    force: bool = False,
    console: Console | None = None,
) -> GoldenManifest:
    """Record ``script`` with ``args`` (``options``: what the run starts from, its seed included) as
    the golden directory ``out``: once, or with ``band`` twice, side by side where the machine has room.
    ``snapshot_budget``: the bytes of parameter snapshots kept (0: none; the fingerprints decide bit
    for bit, snapshots only measure how far a run is). The manifest written to ``out/golden.json``."""
    script = validate_script(script)
    _check_out(out, force)
    staging = out.with_name(f".{out.name}.recording")
    if staging.is_dir() and not staging.is_symlink():  # a recording that did not finish, unless one is going on
        claim_run_dir(staging, fresh=False)
        release_run_dir(staging)
        shutil.rmtree(staging)
    create_run_dir(staging)
    try:
        manifest = _record(script, args, staging, options, band, snapshot_budget, nproc, timeout, console)
    except BaseException:
        release_run_dir(staging)
        shutil.rmtree(staging, ignore_errors=True)
        raise
    release_run_dir(staging)
    _put_in_place(staging, out)
    return manifest


def _check_out(out: Path, force: bool) -> None:
    """Refuse, before anything runs, an ``out`` that is a file or a link, or a directory that holds
    something other than a golden directory, or a golden directory without ``force``."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise InputError(f"{out} exists and is not a directory: choose another --out")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / GOLDEN_FILE).is_file():
        raise InputError(f"{out} already exists and is not a golden directory: choose another --out, or delete it")
    if not force:
        raise InputError(f"{out} already holds a golden run: give --force to record it again")


def _record(
    script: Path,
    args: list[str],
    staging: Path,
    options: RunOptions,
    band: bool,
    snapshot_budget: int,
    nproc: int,
    timeout: float | None,
    console: Console | None,
) -> GoldenManifest:
    checker = Checker(
        script,
        args,
        staging,
        options=options,
        snapshots=snapshot_budget > 0,
        console=console or Console(stderr=True),
        nproc=nproc,
        timeout=timeout,
    )
    specs = [RunSpec(REFERENCE, None, "the golden run")]
    if band:
        specs.append(RunSpec(SECOND, None, "the golden run again, for its run-to-run band"))
    runs = [run for run, _ in checker.run_all(specs)]
    for spec, run in zip(specs, runs):
        end = checker.endings[spec.label]
        if not end.ok:
            raise ScriptFailed(f"the script did not end normally ({end.problems[0]}): nothing recorded")
    steps = min(len(log.of(Step)) for log in runs[0].logs)
    if steps == 0:
        raise InputError(
            f"{script.name} recorded no training step (no backward() and optimizer step): nothing recorded"
        )
    run_to_run = None
    if band:
        from ..check.comparison import diff

        run_to_run = diff(staging / REFERENCE, staging / SECOND).verdict_line
    for run in runs:
        _keep_logs(run)
    snapshot_bytes = _keep_snapshots(staging, snapshot_budget)
    (staging / LOCK_FILE).unlink(missing_ok=True)
    header = runs[0].logs[0].header
    params = runs[0].logs[0].of(Params)
    step_logs = sum(f.stat().st_size for f in staging.glob(f"*/rank-*/{STEPS_FILE}"))
    tensors = len(params[0].names) if params else 0
    logs = len(runs) * len(runs[0].logs)  # the step logs: one per rank of each run
    sizes: GoldenSizes = {
        "bytes": 0,  # once the manifest is written
        "fixed": 0,
        "steps": steps,
        "parameters": tensors,
        "per_step": round(step_logs / steps, 1),
        "per_parameter_step": round(step_logs / steps / logs / max(tensors, 1), 2),
        "snapshot_bytes": snapshot_bytes,
    }
    manifest: GoldenManifest = {
        "schema": GOLDEN_SCHEMA,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "torchrepro_version": header.torchrepro_version if header else __version__,
        "torch_version": header.torch_version if header else "",
        "python_version": header.python_version if header else sys.version.split()[0],
        "device": device_of(header),
        "world_size": len(runs[0].logs),
        "script": script.name,
        "script_sha256": script_sha256(script),
        "args": args,
        "seed": options.seed,
        "nproc": nproc,
        "steps": steps,
        "runs": [spec.label for spec in specs],
        "run_to_run": run_to_run,
        "snapshot_budget": snapshot_budget,
        "sizes": sizes,
    }
    while True:  # the manifest counts itself: written again until the size it states is its directory's
        write_manifest(staging, manifest)
        total = disk_use(staging)[0]
        if total == manifest["sizes"]["bytes"]:
            break
        manifest["sizes"]["bytes"], manifest["sizes"]["fixed"] = total, total - step_logs - snapshot_bytes
    return manifest


def script_sha256(script: Path) -> str:
    """The sha256 of the script's bytes (a golden says when the script changed since)."""
    return hashlib.sha256(script.read_bytes()).hexdigest()


def _keep_logs(run: Run) -> None:
    """Cut a recorded run directory to what a golden needs: ``run.json`` and each rank's event log
    (and snapshots, cut later to the budget); the output logs, stacks and anything else removed."""
    for item in run.path.iterdir():
        if item.name in KEPT:
            continue
        if item.is_dir() and not item.is_symlink() and item.name.startswith("rank-"):
            for inner in item.iterdir():
                if inner.name not in (EVENTS_FILE, STEPS_FILE, "snapshots"):
                    shutil.rmtree(inner) if inner.is_dir() and not inner.is_symlink() else inner.unlink()
            continue
        shutil.rmtree(item) if item.is_dir() and not item.is_symlink() else item.unlink()


def _keep_snapshots(staging: Path, budget: int) -> int:
    """Keep the parameter snapshots that fit in ``budget`` bytes, one snapshot step of every run and
    rank at a time: the last step's full parameters first, then the sketches from the last step
    back; the bytes kept."""
    files = [p for p in staging.glob("*/rank-*/snapshots/*.npz") if p.is_file()]
    groups: dict[tuple[int, int], list[Path]] = {}
    for path in files:
        kind, _, step = path.stem.partition("-")
        if step.isdigit():  # full copies ("step") before sketches, later steps first
            groups.setdefault((0 if kind == "step" else 1, -int(step)), []).append(path)
    last = min((key for key in groups if key[0] == 0), default=None)
    kept, used = set(), 0
    for key in sorted(groups):
        if key[0] == 0 and key != last:
            continue
        size = sum(p.stat().st_size for p in groups[key])
        if used + size <= budget:
            kept.update(groups[key])
            used += size
    for path in files:
        if path not in kept:
            path.unlink()
    for folder in staging.glob("*/rank-*/snapshots"):
        if not any(folder.iterdir()):
            folder.rmdir()
    return used


def _put_in_place(staging: Path, out: Path) -> None:
    """The finished recording becomes ``out`` (an older golden there is replaced, removed after)."""
    old = out.with_name(f".{out.name}.replaced-{os.getpid()}")
    if out.is_dir() and any(out.iterdir()):
        out.rename(old)
    elif out.is_dir():
        out.rmdir()
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
