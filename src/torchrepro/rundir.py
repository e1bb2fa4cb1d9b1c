"""Run directories: ``RUN_DIR/run.json``, ``RUN_DIR/rank-<r>/events.jsonl``, ``RUN_DIR/report.json``,
and ``RUN_DIR/launcher/`` when the launched process only started the ranks (see ``follow``).

A report merges whatever rank directories are present, so folders copied together from
several nodes make one run.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .errors import InputError
from .events import EventLog, rank_logs, read_events

RUN_FILE = "run.json"
REPORT_FILE = "report.json"
HTML_FILE = "report.html"


def replay_file(path: Path, rank: int, world_size: int) -> Path:
    """Where rank ``rank`` writes a replay's record (one file per rank when there are several)."""
    return path if world_size <= 1 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically (temp file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fp:
            fp.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(directory: Path, report: dict[str, Any]) -> None:
    """Write ``report.json`` and, beside it, ``report.html`` (the one place reports are saved)."""
    from .report.html import write_html

    write_json(directory / REPORT_FILE, report)
    write_html(report, directory / HTML_FILE)


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (see :func:`write_text`)."""
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


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
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise InputError(f"{path} already exists and is not empty: choose another --out, or delete it")
    path.mkdir(parents=True, exist_ok=True)
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
    with _no_gc():  # millions of small objects: the cyclic collector would rescan them again and again
        for file in files:
            try:
                log = read_events(file)
            except OSError as exc:
                run.problems.append(f"{file}: unreadable ({exc})")
                continue
            run.logs.append(log)
            run.problems.extend(log.problems)
    if not run.logs:
        raise InputError(f"no readable event log in {path}")
    return run
