"""Run directories: ``RUN_DIR/run.json``, ``RUN_DIR/rank-<r>/events.jsonl``, ``RUN_DIR/report.json``,
and ``RUN_DIR/launcher/`` when the launched process only started the ranks (see ``follow``).

A report merges whatever rank directories are present, so folders copied together from
several nodes make one run.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from .errors import InputError
from .events import EventLog, Shared, rank_logs, read_events

RUN_FILE = "run.json"
REPORT_FILE = "report.json"
HTML_FILE = "report.html"


def replay_file(path: Path, rank: int, world_size: int | None = None) -> Path:
    """Where rank ``rank`` writes a replay's record (one file per rank when there are several).
    ``world_size=None`` reads one back when the world size was not known in advance (ranks the
    script started itself): the rank's own file where it exists, else the single process's."""
    own = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    if world_size is None:
        return own if rank or own.exists() else path
    return path if world_size <= 1 else own


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` for the block to write; it replaces ``path`` (with the mode
    of the file it replaces, or the mode ``open()`` gives a new one) only if the block succeeds,
    and is removed otherwise. The one way torchrepro writes a file another process may read."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.is_file() else _new_file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    """Write a file atomically (:func:`atomic_path`). :class:`InputError` if it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None


def _new_file_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically (see :func:`write_bytes`)."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (see :func:`write_bytes`)."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def check_output(path: Path, *, force: bool = False, inputs: Iterable[Path] = ()) -> Path:
    """A file the user named for output (``--json``, ``--junit``), checked before anything runs:
    :class:`InputError` if it is a directory, cannot be created there (a regular file on the way,
    a read-only or virtual file system), is one of ``inputs`` (a script, or a file inside a run
    directory being read), or exists and not ``force``. Missing folders are created when written."""
    if path.is_dir():
        raise InputError(f"{path} is a directory: name a file to write")
    folder = next(p for p in path.absolute().parents if p.exists())
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file")
        tempfile.TemporaryFile(dir=folder).close()  # the one sure test (root passes access(), /proc refuses)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    target = path.resolve()
    for item in inputs:
        item = Path(item).resolve()
        if target == item or (item.is_dir() and target.is_relative_to(item) and target.exists()):
            raise InputError(f"{path} is an input of this command: write the output elsewhere")
    if path.exists() and not force:
        raise InputError(f"{path} already exists: choose another name, or pass --force to replace it")
    return path


def default_run_dir(script: str | os.PathLike, root: str = "torchrepro-runs", label: str = "") -> Path:
    """``torchrepro-runs/<timestamp>-<script>[-label]``, unique."""
    stem = re.sub(r"[^\w.-]", "_", Path(script).stem) or "run"
    base = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}{'-' + label if label else ''}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def create_run_dir(path: Path) -> Path:
    """Make a new, empty run directory; an existing non-empty one is an error (never overwritten)."""
    try:
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise InputError(f"{path} already exists and is not empty: choose another --out, or delete it")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the run directory {path}: {exc.strerror or exc}") from None
    return path


@dataclass
class Run:
    """A run directory as read back: ``run.json`` (if any) and every rank's events."""

    path: Path
    meta: dict[str, Any] = field(default_factory=dict)
    logs: list[EventLog] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return [log.rank for log in self.logs]


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_run(path: str | os.PathLike) -> Run:
    """Read a run directory; :class:`InputError` if it holds no event log at all."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"no such run directory: {path}")
    run = Run(path)
    meta_file = path / RUN_FILE
    if meta_file.exists():
        try:
            run.meta = json.loads(meta_file.read_text())
        except (OSError, ValueError) as exc:
            run.problems.append(f"{meta_file}: unreadable ({exc}); using the event logs alone")
    files = rank_logs(path)
    if not files:
        raise InputError(f"{path} holds no rank-*/events.jsonl: not a torchrepro run directory")
    shared = Shared()  # what agrees across ranks, one object each
    with _no_gc():  # millions of small objects: the cyclic collector would rescan them again and again
        for file in files:
            if not file.is_file():  # a FIFO or device would block or never end
                run.problems.append(f"{file}: not a regular file, skipped")
                continue
            try:
                log = read_events(file, shared)
            except OSError as exc:
                run.problems.append(f"{file}: unreadable ({exc})")
                continue
            run.logs.append(log)
            run.problems.extend(log.problems)
    if not run.logs:
        raise InputError(f"no readable event log in {path}")
    seen: dict[int, Path] = {}
    for log in run.logs:
        if log.rank in seen:
            raise InputError(
                f"{path}: rank {log.rank} is logged twice ({seen[log.rank].parent.name} and "
                f"{log.path.parent.name}): keep one folder per rank"
            )
        seen[log.rank] = log.path
    return run
