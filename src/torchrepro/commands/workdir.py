"""Every run a command makes only to compare (``check``'s runs and replays, ``drift``'s runs,
``doctor --fixes``' baseline and fix runs) starts from the same files: each starts in a fresh copy of
torchrepro's working directory, made before it starts and removed once it has ended
(:func:`fresh_workdir`). A script that saves a checkpoint in its working directory and resumes
from it when present (the PyTorch DDP tutorial's ``snapshot.pt``) therefore resumes in no run
unless it did before the command started, and every run sees what the first one saw.

A working directory too large to copy (over :data:`COPY_LIMIT_BYTES` or :data:`COPY_LIMIT_FILES`
files), or a run whose arguments name a path outside it by a relative path (``../data``, which would
not resolve from the copy), runs in place, as every run does with ``TORCHREPRO_WORKDIR=shared``.
A FIFO, a socket or a device file in the working directory is neither copied nor watched (reading
one would block, or fail, and no copy of it means anything): each run's ``run.json`` names them
(``workdir.not_copied``) and the command says so once, in a warning line.
What a run writes in place (in the working directory itself: in place, or through an absolute path)
is found by comparing the size and modification time of every file before and after it (but a log
some process holds open for writing: :func:`_held_for_writing`); a later run that read such a file
(its access time moved past the later run's start) is a :class:`Crossing`: ``check`` names it
instead of blaming anything else.
How, and why a copy: docs/workdir.md."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator, Sequence, Set
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .. import _state
from ..eventlog.rundir import LOCK_FILE

COPY_LIMIT_BYTES = 256 * 2**20  # a larger working directory runs in place, its writes detected
COPY_LIMIT_FILES = 20_000
STAT_LIMIT_FILES = 100_000  # past this many files, writes are looked for in the first ones only
COPY_DIR = "cwd"  # the copy, inside the run's own directory while it runs
# never copied nor watched, at any depth: torchrepro's own outputs (the default --out root), version
# control, environments and caches (a project's .venv alone exceeds the copy's bound)
SKIPPED = frozenset(
    {
        "torchrepro-runs",
        ".git",
        ".hg",
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
    }
)
# an environment under any name (``.venv-py311``, ``env``): a folder holding one of these
ENVIRONMENT_MARKERS = ("pyvenv.cfg", "conda-meta")
WORKDIR_VAR = "TORCHREPRO_WORKDIR"  # "shared": every run in the working directory itself (writes still detected)  # torchrepro's own outputs (the default --out root) are never copied

Stats = dict[str, tuple[int, int]]  # path relative to the root -> (size, mtime_ns)
_SAID_NOT_COPIED: _state.Kept[set[str]] = _state.kept(set)  # special files a warning named (once each)


class Inventory(NamedTuple):
    """What :func:`_inventory` found under a directory."""

    stats: Stats  # every file, symlink and directory (size -1)
    total: int  # the files' bytes
    truncated: bool  # the walk stopped at its limit of files
    special: list[str]  # FIFOs, sockets, devices (relative paths, each with what it is): never copied nor watched


@dataclass(frozen=True)
class Crossing:
    """A file one run wrote in the shared working directory and a later run read."""

    path: str  # relative to the working directory
    wrote: str  # the label of the run that wrote it
    read: str  # ... and of the later run that read it


@dataclass
class Workdir:
    """Where one run starts: ``cwd`` (None: torchrepro's own, shared) and ``script`` as it is run
    there (by its own absolute path: what the report shows of its source is the user's file, and
    paths relative to the script's own folder are the user's); what it wrote, in its copy and in
    the shared directory."""

    label: str
    cwd: Path | None
    script: Path
    why_shared: str | None = None
    copied_bytes: int = 0
    wrote_in_copy: list[str] = field(default_factory=list)
    wrote_shared: list[str] = field(default_factory=list)
    not_copied: list[str] = field(default_factory=list)  # special files (:class:`Inventory`)

    def record(self) -> dict[str, object]:
        """What the run's ``run.json`` says of it (``workdir``)."""
        out: dict[str, object] = {"mode": "copy" if self.cwd is not None else "shared"}
        if self.cwd is not None:
            out["copied_bytes"] = self.copied_bytes
        if self.not_copied:
            out["not_copied"] = self.not_copied[:20]
        if self.why_shared:
            out["why_shared"] = self.why_shared
        if self.wrote_in_copy:
            out["wrote_in_copy"] = self.wrote_in_copy[:20]
        if self.wrote_shared:
            out["wrote_shared"] = self.wrote_shared[:20]
        return out


class Ledger:
    """The runs of one command: what each wrote in the shared working directory, and which later
    run read it (:attr:`crossings`). Thread-safe (runs side by side)."""

    def __init__(self, root: Path | None = None):
        self.root = (root or Path.cwd()).resolve()
        self.written: dict[str, tuple[str, int]] = {}  # path -> (the run that wrote it last, mtime_ns)
        self.crossings: list[Crossing] = []
        self.workdirs: dict[str, Workdir] = {}
        self._lock = threading.Lock()

    def wrote_in_copies(self) -> dict[str, list[str]]:
        """Each run's files written in its own copy (none shared: said, never blamed)."""
        return {label: w.wrote_in_copy for label, w in self.workdirs.items() if w.wrote_in_copy}

    def _read_since(self, label: str, started_ns: int) -> None:
        for path, (writer, written_ns) in list(self.written.items()):
            if writer == label:
                continue
            try:
                st = os.stat(self.root / path)
            except OSError:
                continue
            # the access time of a file read after it was last written moves (relatime), a write does not
            if st.st_atime_ns >= started_ns and st.st_atime_ns > written_ns:
                self.crossings.append(Crossing(path, writer, label))


def _outside(root: Path, args: Sequence[str]) -> str | None:
    """An argument naming an existing path outside ``root`` by a relative path (it would not
    resolve from a copy), or None."""
    for arg in args:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value or os.path.isabs(value) or len(value) > 4096:
            continue
        try:
            target = root / value
            if target.exists() and not target.resolve().is_relative_to(root):
                return value
        except (OSError, ValueError):
            continue
    return None


def _held_for_writing(root: Path) -> set[tuple[int, int]]:
    """The regular files on ``root``'s device that a process holds open for writing, as (device,
    inode): torchrepro's own stdout and stderr (``torchrepro check ... > check.log``), a ``| tee
    check.log`` beside it, another job's log. Taken before a run starts and after it ended, they are
    never the run's: they are neither copied nor watched (a user reading the log as it grows is no run
    reading another's file). Found through ``/proc`` (Linux); elsewhere, torchrepro's own output only."""
    held = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            held.add((st.st_dev, st.st_ino))
    try:
        device = root.stat().st_dev
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return held
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd_name in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd_name}")
                if not stat.S_ISREG(st.st_mode) or st.st_dev != device or (st.st_dev, st.st_ino) in held:
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd_name}") as info:
                    flags = next(int(line.split()[1], 8) for line in info if line.startswith("flags:"))
            except (OSError, StopIteration, ValueError, IndexError):
                continue
            if flags & (os.O_WRONLY | os.O_RDWR):
                held.add((st.st_dev, st.st_ino))
    return held


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def _inventory(root: Path, skip: set[Path], limit_files: int, held: Set[tuple[int, int]] = frozenset()) -> Inventory:
    """Every file, symlink and directory under ``root`` (not into ``skip``, an environment
    (:data:`ENVIRONMENT_MARKERS`) nor another command's output, a directory holding a run
    directory's lock file; not following links), but the files ``held`` open for writing
    (:func:`_held_for_writing`) and the special files (listed apart): its size and mtime (a
    directory: size -1); the files' total size; whether the walk stopped at ``limit_files``."""
    stats: Stats = {}
    special: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        links = [d for d in dirnames if (here / d).is_symlink()]
        dirnames[:] = [
            d
            for d in dirnames
            if d not in links
            and d not in SKIPPED
            and (here / d) not in skip
            and not any((here / d / marker).exists() for marker in (LOCK_FILE, *ENVIRONMENT_MARKERS))
        ]
        for name in dirnames:
            stats[str((here / name).relative_to(root))] = (-1, 0)
        for name in [*filenames, *links]:
            path = here / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in held:
                continue
            what = next((name for test, name in _SPECIAL if test(st.st_mode)), None)
            if what is not None:
                special.append(f"{path.relative_to(root)} ({what})")
                continue
            stats[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
            total += st.st_size
            if len(stats) >= limit_files:
                return Inventory(stats, total, True, special)
    return Inventory(stats, total, False, special)


def _changed(before: Stats, after: Stats) -> list[str]:
    return sorted(p for p, s in after.items() if s[0] >= 0 and before.get(p) != s)


def _copy(root: Path, dest: Path, files: Stats) -> None:
    """``files`` (relative to ``root``) into ``dest``: directories, symlinks as symlinks, contents
    and times as they are."""
    dest.mkdir(parents=True)
    for rel, (size, _) in sorted(files.items()):
        src, dst = root / rel, dest / rel
        if size < 0:
            dst.mkdir(parents=True, exist_ok=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def _survey(
    root: Path, args: Sequence[str], skip: set[Path], held: Set[tuple[int, int]]
) -> tuple[Inventory, str | None]:
    """The working directory's files (:func:`_inventory`), and why a run cannot start in a copy of
    it (None: it can)."""
    found = _inventory(root, skip, STAT_LIMIT_FILES, held)
    stats, total, truncated = found.stats, found.total, found.truncated
    outside = _outside(root, args)
    why = None
    if os.environ.get(WORKDIR_VAR) == "shared":
        why = f"{WORKDIR_VAR}=shared"
    elif outside is not None:
        why = f"the argument {outside!r} is a path outside the working directory"
    elif truncated or len(stats) > COPY_LIMIT_FILES:
        why = f"the working directory holds over {COPY_LIMIT_FILES} files"
    elif total > COPY_LIMIT_BYTES:
        why = f"the working directory holds {total / 2**20:.0f} MiB (copied up to {COPY_LIMIT_BYTES // 2**20} MiB)"
    return found, why


def why_shared(args: Sequence[str], skip: Sequence[Path] = ()) -> str | None:
    """Why runs with these arguments would share the working directory (None: each gets a copy);
    runs that share it go one after the other (one writing there while another reads is a race)."""
    root = Path.cwd().resolve()
    return _survey(root, args, {p.resolve() for p in skip}, _held_for_writing(root))[1]


@contextmanager
def fresh_workdir(
    run_dir: Path,
    script: Path,
    args: Sequence[str],
    label: str,
    ledger: Ledger | None = None,
    skip: Sequence[Path] = (),
    enabled: bool = True,
) -> Iterator[Workdir]:
    """Where the run of ``script`` writing into ``run_dir`` starts: a fresh copy of the working
    directory (``run_dir/cwd``, removed when the block ends), or the shared one when it cannot be
    copied (:class:`Workdir` says why). ``skip``: directories not copied (the command's output);
    ``ledger``: the command's runs, told what this one wrote and read in the shared directory.
    ``enabled=False``: the run starts in the working directory, as a plain run would, unwatched."""
    if not enabled:
        yield Workdir(label, None, script)
        return
    ledger = ledger or Ledger()
    root = ledger.root
    skip_set = {p.resolve() for p in (*skip, run_dir)}
    held = _held_for_writing(root)
    found, why = _survey(root, args, skip_set, held)
    stats = found.stats
    copy = run_dir.resolve() / COPY_DIR
    script = script.resolve()
    where = Workdir(label, None if why else copy, script, why_shared=why)
    if why is None:
        shutil.rmtree(copy, ignore_errors=True)
        _copy(root, copy, stats)
        where.copied_bytes = found.total
        where.not_copied = found.special
        _say_not_copied(found.special)
    started = time.time_ns()
    try:
        yield where
    finally:
        after = _inventory(root, skip_set, STAT_LIMIT_FILES, held | _held_for_writing(root)).stats
        if where.cwd is not None:
            copied = _inventory(where.cwd, set(), STAT_LIMIT_FILES).stats
            where.wrote_in_copy = _changed(stats, copied)
            shutil.rmtree(where.cwd, ignore_errors=True)
        where.wrote_shared = _changed(stats, after)
        with ledger._lock:
            ledger._read_since(label, started)
            for path in where.wrote_shared:
                ledger.written[path] = (label, after[path][1])
            ledger.workdirs[label] = where


def _say_not_copied(special: list[str]) -> None:
    """One warning line for the special files of the working directory the runs' copies lack
    (each named once in a command, however many runs it starts)."""
    from ..render.sanitize import visible

    said = _SAID_NOT_COPIED.value
    new = [name for name in special if name not in said]
    if not new:
        return
    said.update(new)
    more = f" and {len(new) - 5} more" if len(new) > 5 else ""
    print(
        f"torchrepro: warning: not copied into the runs' working directories: {visible(', '.join(new[:5]))}{more}: "
        "special files are not copied (a run that opens one there finds it missing)",
        file=sys.stderr,
        flush=True,
    )
