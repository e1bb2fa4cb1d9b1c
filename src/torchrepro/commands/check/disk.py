"""Whether the disk can hold what a ``check`` writes, decided before any run starts, and what
is left of it once the check has decided.

While the runs go on, a run keeps at most two copies of its parameters (the first snapshot step's
and the latest's) and a sketch of at most
:data:`~torchrepro.capture.snapshots.SKETCH_BYTES` a snapshot step (docs/fingerprint.md,
"Snapshots"), beside its event log: the most a check needs is that, for every run it may start.
The parameters' size is not known before the script runs: the estimate is :data:`RUN_BYTES` a run
(:data:`LOG_BYTES` when no snapshot is kept), and ``--disk-budget`` replaces it with what the user
knows (two parameter copies a run, 1 MB a snapshot step, for the runs listed by
:func:`planned_runs`). Once the check has decided, before its report is written (so that the size
said with the report is what stays on disk), :func:`keep_evidence` leaves at most two copies in the
whole check directory: those of the pair of runs that differ at one step (the first divergent one
where they kept it), none where they are bit-exact.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from ...errors import UserError
from ...eventlog.rundir import size_text

RUN_BYTES = 64 << 20  # a run with snapshots, its parameters' size unknown
LOG_BYTES = 8 << 20  # a run without: its event log
LADDER_RUNS = 5  # the most fix runs after a divergence (analysis.fixes.LADDER)


def planned_runs(runs: int, against: str | None, fixes: bool | None) -> int:
    """The most runs a check may start: ``--against``: the reference, the compiled run, the
    third run of the decomposition and the ``aot_eager`` stage; else ``runs`` and the fix ladder's."""
    if against is not None:
        return 4
    return runs + (0 if fixes is False else LADDER_RUNS)


def free_bytes(folder: Path) -> int:
    """Free bytes for an unprivileged writer on the file system of ``folder`` (or its nearest existing parent)."""
    path = folder.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def require_disk(folder: Path, runs: int, snapshots: bool, budget: int | None) -> None:
    """Refuse (one line, exit 2) when ``folder``'s file system has less free space than ``budget``
    or, without one, the estimate for ``runs`` runs."""
    need = budget if budget is not None else runs * (RUN_BYTES if snapshots else LOG_BYTES)
    free = free_bytes(folder)
    if free >= need:
        return
    what = (
        "--disk-budget"
        if budget is not None
        else f"an estimated {size_text(RUN_BYTES if snapshots else LOG_BYTES)} for each of up to {runs} runs"
    )
    raise UserError(
        f"not enough disk for the check: {size_text(free)} free where {folder} is, {size_text(need)} needed "
        f"({what}); free space, choose --out elsewhere, or give --disk-budget SIZE (two parameter copies "
        "a run, 1 MB a snapshot step)"
    )


def keep_evidence(run_dir: Path, pair: Sequence[str], differ: bool, step: int | None = None) -> int:
    """Once a check has decided: delete the full parameter copies (``step-<n>.npz``) of every run
    in the check directory ``run_dir`` but the two compared (``pair``), and theirs too where they do
    not ``differ`` (bit-exact); of the pair's, keep one step: the first divergent ``step`` where both
    kept it whole, else the latest both kept. Delete the compiled graphs saved for ``torchrepro
    repro`` (``graphs/``) of every run but the pair. Sketches stay: the divergence curve of any two
    runs is still drawn, estimated (``max_abs`` null) where one of them kept no full copy. The bytes freed."""
    copies = sorted(run_dir.glob("*/rank-*/snapshots/step-*.npz"))
    steps_of = {
        label: {int(p.stem.split("-")[1]) for p in copies if p.relative_to(run_dir).parts[0] == label} for label in pair
    }
    both = set.intersection(*steps_of.values()) if differ and steps_of else set()
    kept = step if step in both else max(both, default=None)
    freed = 0
    for path in copies:
        if path.relative_to(run_dir).parts[0] not in pair or int(path.stem.split("-")[1]) != kept:
            freed += path.stat().st_size
            path.unlink()
    for folder in sorted(run_dir.glob("*/rank-*/graphs")):
        if folder.relative_to(run_dir).parts[0] not in pair:
            freed += sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            shutil.rmtree(folder)
    return freed
