"""Run directories: ``RUN_DIR/run.json``, ``RUN_DIR/rank-<r>/events.jsonl``, ``RUN_DIR/report.json``,
and ``RUN_DIR/launcher/`` when the launched process only started the ranks (see ``follow``).

A report merges whatever rank directories are present, so folders copied together from
several nodes make one run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import importlib
import json
import os
import pickle
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Iterator, TypedDict

from ..errors import InputError
from .jsoncheck import loads, python_types, schema_problem
from .event_codec import Shared
from .event_reader import EventLog, StepReduce, open_regular, rank_logs, read_events
from .events import EVENTS_FILE
from .payloads import JsonObject
from .stepstream import STEPS_FILE

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
        record_write_error(path, exc)
        raise InputError(cannot_write(path, exc)) from None


def cannot_write(path: Path | None, exc: OSError) -> str:
    """The one line for a file that could not be written (a full disk, a quota, an I/O error...)."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        why += ": free some space and run again"
    return f"cannot write {path}: {why}" if path is not None else f"cannot write: {why}"


def _new_file_mode() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_text(path: Path, text: str) -> None:
    """Write a text file atomically (see :func:`write_bytes`)."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (see :func:`write_bytes`)."""
    write_text(path, json_text(data))


def json_text(data: Any) -> str:
    """How torchrepro writes a JSON file: indented, one newline at the end."""
    return json.dumps(data, indent=2, default=str) + "\n"


def disk_use(path: Path) -> tuple[int, int]:
    """Bytes under a run directory: all its files, and its event logs among them (every
    ``events.jsonl`` and ``steps.bin``, the runs of a check included)."""
    total = logs = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed while walked
                size = os.lstat(os.path.join(folder, name)).st_size
                total += size
                logs += size if name in (EVENTS_FILE, STEPS_FILE) else 0
    return total, logs


def size_text(n: float) -> str:
    """``n`` bytes in kB, MB or GB (powers of 1000), as ``du --si`` says them."""
    units = ("B", "kB", "MB", "GB")
    i = 0
    while n >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def default_run_dir(script: str | os.PathLike[str], root: str = "torchrepro-runs", label: str = "") -> Path:
    """``torchrepro-runs/<timestamp>-<script>[-label]``, unique."""
    stem = re.sub(r"[^\w.-]", "_", Path(script).stem) or "run"
    base = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{stem}{'-' + label if label else ''}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def create_run_dir(path: Path) -> Path:
    """Make a new, empty run directory and hold it for this process (:func:`claim_run_dir`); an
    existing non-empty one is an error (never overwritten)."""
    return claim_run_dir(path)


# --- one writer per run directory -----------------------------------------------------------------

LOCK_FILE = ".torchrepro.lock"
_LOCK_NOTE = 512  # the most of a lock file read or written: the pid, and a write error (record_write_error)
_HELD: dict[Path, int] = {}  # the run directories this process holds: resolved path -> lock file descriptor


def claim_run_dir(path: Path, *, fresh: bool = True) -> Path:
    """Make ``path`` (created if missing) this process's to write until it ends or
    :func:`release_run_dir`: an advisory lock (``flock``) on ``path/.torchrepro.lock``, which
    holds the holder's pid. The kernel drops the lock when its holder dies, even by SIGKILL, so no
    stale lock outlives a writer. Held by another process: :class:`InputError` naming the
    directory and that pid. ``fresh``: the directory must also be empty but for the lock file
    (tested before anything is created in it, and again once held, so two commands started
    together on one empty directory cannot both write it). Readers take no lock: ``report``, ``diff``
    and ``repro`` refuse a directory another process writes (:func:`refuse_while_written`), ``watch``
    reads it and says it is being written (:func:`writer_of`)."""
    key = path.resolve()
    if key in _HELD:  # this process writes it already (one command after another in one process)
        return path
    lock = path / LOCK_FILE
    fd = _locked(path, lock, create=False) if lock.is_file() else None  # a writer at work is named first
    try:
        if fresh:
            _must_be_empty(path)
        if fd is None:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise InputError(f"cannot create the run directory {path}: {exc.strerror or exc}") from None
            fd = _locked(path, lock, create=True)
        if fresh:
            _must_be_empty(path)  # again, now that it is ours: another command may have written it meanwhile
    except InputError:
        if fd is not None:
            os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd
    return path


def record_write_error(path: Path, exc: OSError) -> None:
    """Keep, where it survives a full disk, that this process could not write ``path`` inside a run
    directory it holds: the lock file (:func:`claim_run_dir`), whose first line is the holder's pid,
    gets a second one, ``<errno name> <path in the run directory>``, written within the block the pid
    already occupies (no new block is needed). A run read later as interrupted then says why
    (:func:`write_error`) instead of guessing a SIGKILL."""
    target = path.absolute()
    for held, fd in list(_HELD.items()):
        if held == target.parent.resolve() or held in target.resolve().parents:
            name = errno.errorcode.get(exc.errno or 0, "EIO")
            line = f"{os.getpid()}\n{name} {target.resolve().relative_to(held)}\n".encode()[:_LOCK_NOTE]
            with contextlib.suppress(OSError):
                os.pwrite(fd, line, 0)
                os.fsync(fd)


def write_error(run_dir: Path) -> dict[str, str] | None:
    """What :func:`record_write_error` kept in ``run_dir``'s lock file: ``{"errno": "ENOSPC", "file":
    "run.json"}``; None when nothing was."""
    try:
        with open_regular(run_dir / LOCK_FILE) as fp:
            lines = fp.read(_LOCK_NOTE).decode("utf-8", "replace").splitlines()
    except (OSError, InputError):
        return None
    name, _, file = lines[1].partition(" ") if len(lines) > 1 else ("", "", "")
    return {"errno": name, "file": file} if name.startswith("E") and file else None


def _locked(path: Path, lock: Path, create: bool) -> int:
    """``lock`` opened and locked (its descriptor); :class:`InputError` naming the holder if another has it."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
    except OSError as exc:
        raise InputError(f"cannot create the run directory {path}: {exc.strerror or exc}") from None
    for attempt in range(_LOCK_TRIES):  # a reader's probe (writer_of) holds it for a moment only
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if attempt + 1 < _LOCK_TRIES:
                time.sleep(0.02)
    else:
        written = os.pread(fd, 32, 0)
        if not written:  # the holder writes its pid just after taking the lock
            time.sleep(0.2)
            written = os.pread(fd, 32, 0)
        os.close(fd)
        holder = written.decode("ascii", "replace").partition("\n")[0].strip() or "unknown"
        raise InputError(f"{path} is being written by another torchrepro (pid {holder}): wait for it to end") from None
    return fd


_LOCK_TRIES = 5


def writer_of(path: Path) -> tuple[Path, str] | None:
    """The run directory holding ``path`` (``path`` itself, or a directory above it: a check's runs
    are inside the check's) that another process holds as its writer (:func:`claim_run_dir`), and
    that writer's pid as its lock file says; None when no other process writes it. Probed with a
    shared lock taken and let go at once (a writer claiming it meanwhile tries again)."""
    where = path.absolute()
    for folder in (where, *where.parents):
        lock = folder / LOCK_FILE
        try:
            if folder.resolve() in _HELD or not lock.is_file():
                continue
            fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # (another error: a filesystem without locks, which says nothing)
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").partition("\n")[0].strip() or "unknown"
            return folder, holder
        finally:
            os.close(fd)  # (the shared lock goes with it)
    return None


def refuse_while_written(path: Path) -> None:
    """:class:`InputError` when another process is writing the run directory ``path`` is in
    (:func:`writer_of`): what ``report``, ``diff`` and ``repro`` read must be finished."""
    held = writer_of(path)
    if held is not None:
        folder, pid = held
        inside = folder != path.absolute()
        raise InputError(
            f"{path}{f' (inside {folder})' if inside else ''} is being written by torchrepro (pid {pid}): wait for it "
            f"to end, or follow it with torchrepro watch {folder if inside else path}"
        )


def _must_be_empty(path: Path) -> None:
    if path.exists() and (not path.is_dir() or any(p.name != LOCK_FILE for p in path.iterdir())):
        raise InputError(f"{path} already exists and is not empty: choose another --out, or delete it")


def release_run_dir(path: Path) -> None:
    """Let go of a run directory :func:`claim_run_dir` took (before removing it, say)."""
    fd = _HELD.pop(path.resolve(), None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def run_dirs_let_go() -> Iterator[None]:
    """Let go, when the block ends, of every run directory :func:`claim_run_dir` took inside it: a
    command called from Python (``torchrepro.check``) holds its directory while it writes it, not
    while the caller's process lives on (another process may then read it; the same ``out`` given
    again is a directory that is not empty)."""
    before = set(_HELD)
    try:
        yield
    finally:
        for key in set(_HELD) - before:
            os.close(_HELD.pop(key))


# --- how the supervisor's job ended ---------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, from ``/proc``); None if it is gone or unknown."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class Supervisor(TypedDict):
    """``run.json``'s ``supervisor``: the torchrepro process supervising a job (see :func:`supervisor_lost`)."""

    pid: int
    host: str
    start_time: int | None  # clock ticks since boot (None: no /proc)


def supervisor_record() -> Supervisor:
    """What ``run.json`` says, as a job starts, of the torchrepro process supervising it (``supervisor``):
    its pid, host and start time. The job's end is recorded by ``ended`` (with ``exit_code``)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "start_time": process_start_time(os.getpid())}


def supervisor_lost(meta: JsonObject) -> int | None:
    """The pid of a supervisor that ended without recording the end of its job (``run.json`` has a
    ``supervisor`` and no ``ended``, and that process is gone: a different start time, or another
    host's run directory); None otherwise, also for a run without supervisor (``torchrepro run``
    under the user's own torchrun, where each rank's end event decides)."""
    who = meta.get("supervisor")
    pid = who.get("pid") if isinstance(who, dict) else None
    if not isinstance(who, dict) or "ended" in meta or not isinstance(pid, int):
        return None
    if who.get("host") == socket.gethostname() and _running(pid, who.get("start_time")):
        return None
    return pid


def _running(pid: int, start_time: int | None) -> bool:
    if start_time is not None:
        return process_start_time(pid) == start_time
    try:  # no /proc: the pid alone
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@dataclass
class Run:
    """A run directory as read back: ``run.json`` (if any) and every rank's events."""

    path: Path
    meta: JsonObject = field(default_factory=dict)  # run.json: RUN_FIELDS checked, any other field kept as written
    logs: list[EventLog] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # rank logs not read at all (among problems), and why

    @property
    def ranks(self) -> list[int]:
        return [log.rank for log in self.logs]


RUN_SCHEMA = json.loads((Path(__file__).resolve().parent / "schemas" / "run.schema.json").read_text())
# run.json's fields and the JSON types each may hold (null too), from its schema; fields not named
# there are kept as they are (bounded: :func:`~.jsoncheck.bounded`)
RUN_FIELDS: dict[str, tuple[type, ...]] = {
    name: python_types(spec["type"]) for name, spec in RUN_SCHEMA["properties"].items()
}
MAX_JSON = 64 << 20  # run.json, plan.json: larger is not one torchrepro wrote


def read_regular(path: Path, limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of a file of a run directory, at most ``limit``: ``OSError`` when it cannot be
    read, :class:`InputError` when it is not a regular file (a FIFO, a device; without
    ``follow_links``, a symbolic link: :func:`~.event_reader.open_regular`) or holds more."""
    with open_regular(path, follow_links=follow_links) as fp:
        data = fp.read(limit + 1)
    if len(data) > limit:
        over = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit} bytes"
        raise InputError(f"{path}: over {over}: not a file torchrepro wrote")
    return data


def read_json_file(path: Path, *, follow_links: bool = True) -> Any:
    """A small JSON file of a run directory (``run.json``, a drift ``plan.json``): ``OSError``
    when it cannot be read, :class:`InputError` when it is not a regular file or over
    :data:`MAX_JSON` bytes (:func:`read_regular`), ``ValueError`` when it is not JSON."""
    return loads(read_regular(path, MAX_JSON, follow_links=follow_links))


def read_run_json(path: Path) -> JsonObject:
    """``run.json``, its fields checked (:func:`check_fields`, :data:`RUN_FIELDS`) and then against
    its schema and bounds (``eventlog/schemas/run.schema.json``, :func:`~.jsoncheck.schema_problem`);
    :class:`InputError` naming the field and what it should be, also for a file that is not a
    regular file (see :func:`read_json_file`)."""
    meta = read_json_file(path)
    if not isinstance(meta, dict):
        raise InputError(f"{path}: not a JSON object: not a torchrepro run.json")
    check_fields(path, meta, RUN_FIELDS)
    if (problem := schema_problem(meta, RUN_SCHEMA)) is not None:
        raise InputError(f"{path}: {problem}")
    if isinstance(meta.get("stopped_by"), str) and meta["stopped_by"] not in signal.Signals.__members__:
        raise InputError(f"{path}: field 'stopped_by' is {meta['stopped_by']!r}, not a signal name")
    return meta


def check_fields(path: Path, data: Mapping[str, object], fields: dict[str, tuple[type, ...]]) -> None:
    """:class:`InputError` naming the first field of ``data`` (read from ``path``) whose JSON type is
    not one ``fields`` allows it (null is allowed; a field not named there is not checked)."""
    for name, value in data.items():
        accepted = fields.get(name)
        if accepted is None or value is None:
            continue
        if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
            wanted = " or ".join(JSON_TYPES[t] for t in accepted)
            raise InputError(f"{path}: field {name!r} is {JSON_TYPES.get(type(value), 'a value')}, not {wanted}")


JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
}


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_run(
    path: str | os.PathLike[str],
    keep: Callable[[], StepReduce] | None = None,
    jobs: int | None = 1,
    progress: Callable[[str], None] | None = None,
) -> Run:
    """Read a run directory; :class:`InputError` if it holds no event log at all.

    With ``keep``, each rank's log holds, instead of its step events, what ``reduce(columns)``
    makes of them as the rank is read (``EventLog.kept``; ``read_events(reduce=...)``), where
    ``reduce = keep()`` is made once in each process that reads (e.g. ``keep=StepReducer``):
    memory then holds one rank's steps at a time. With ``keep`` too, ``jobs`` processes read the
    ranks (each a contiguous share; this one the first) and send back their logs without the steps;
    ``None``: one per core for logs over :data:`PARALLEL_BYTES`, else one (this process);
    ``progress`` is told, in one line, when reading in processes starts.

    >>> load_run("torchrepro-runs/train", keep=StepReducer, jobs=None).logs[0].kept.count  # doctest: +SKIP
    300
    """
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"no such run directory: {path}")
    run = Run(path)
    meta_file = path / RUN_FILE
    if meta_file.exists():
        try:
            run.meta = read_run_json(meta_file)
        except OSError as exc:
            raise InputError(f"{meta_file}: unreadable ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise InputError(f"{meta_file}: not JSON ({exc})") from None
        if isinstance(run.meta, dict) and (lost := supervisor_lost(run.meta)) is not None:
            said = write_error(path)  # the supervisor could not write (a full disk): not a guess then
            run.meta["interrupted"] = {"supervisor_pid": lost, **({"write_error": said} if said else {})}
    files = rank_logs(path)
    if not files:
        raise InputError(f"{path} holds no rank-*/events.jsonl: not a torchrepro run directory")
    size = sum(map(_log_bytes, files)) if keep is not None else 0  # (chooses jobs)
    if jobs is None:
        jobs = usable_cores() if size >= PARALLEL_BYTES else 1
    jobs = min(jobs, len(files))
    with _no_gc():  # millions of small objects: the cyclic collector would rescan them again and again
        if keep is None or jobs <= 1:
            read = _read_logs(files, keep)
        else:
            if progress is not None:
                progress(f"reading {len(files)} rank logs ({size / 1e6:,.0f} MB) in {jobs} processes")
            read = _read_in_processes(files, keep, jobs)
    for item in read:
        if isinstance(item, str):
            run.problems.append(item)
            run.unread.append(item)
        else:
            run.logs.append(item)
            run.problems.extend(item.damage)  # an older unchecked step log is read as that version read it
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


def _log_bytes(file: Path) -> int:
    """What reading a rank's log costs, in bytes of JSON lines: its events.jsonl, and its steps.bin
    as the ~8x longer lines its records stand for."""
    size = 0
    with contextlib.suppress(OSError):
        size = file.stat().st_size
        size += 8 * file.with_name(STEPS_FILE).stat().st_size
    return size


PARALLEL_BYTES = 128 << 20  # rank logs smaller than this in all are read in one process (starting
# interpreters, ~0.2 s each, would cost about what they save)


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _read_logs(files: list[Path], keep: Callable[[], StepReduce] | None) -> list[EventLog | str]:
    """Each file's log (its steps reduced by ``keep()``, given ``keep``: see :func:`load_run`), or
    why it was not read; what repeats across the ranks' steps is held once (:class:`~.event_codec.Shared`
    or the reducer)."""
    reduce = keep() if keep is not None else None
    shared = Shared() if reduce is None else None
    out: list[EventLog | str] = []
    for file in files:
        try:
            log = read_events(file, shared, reduce)
        except InputError as exc:  # a FIFO or a device: it would block or never end
            out.append(f"{exc}, skipped")
            continue
        except OSError as exc:
            out.append(f"{file}: unreadable ({exc})")
            continue
        out.append(log)
    return out


def _read_in_processes(files: list[Path], keep: Callable[[], StepReduce], jobs: int) -> list[EventLog | str]:
    """:func:`_read_logs` in ``jobs`` processes: this one reads the first contiguous share of
    ``files``, ``jobs - 1`` child processes (fresh interpreters: the caller's own script is not
    imported again, no lock of its threads is inherited) one share each, sending it back pickled
    in one piece (what its ranks share crosses once); the results in the order of ``files``. A
    share whose process fails is read here."""
    shares = [files[i * len(files) // jobs : (i + 1) * len(files) // jobs] for i in range(jobs)]
    package = str(Path(__file__).resolve().parent.parent)  # the torchrepro this process runs
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (package, os.environ.get("PYTHONPATH")))))
    argv = [
        sys.executable,
        "-c",
        "from torchrepro.eventlog.rundir import _serve; _serve()",
        f"{keep.__module__}:{keep.__qualname__}",
        str(os.getpid()),
    ]
    children: list[subprocess.Popen[bytes]] = []
    try:
        for share in shares[1:]:
            child = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
            )
            children.append(child)
            with contextlib.suppress(BrokenPipeError), child.stdin:  # type: ignore[union-attr]
                child.stdin.write(b"\0".join(map(os.fsencode, share)))  # type: ignore[union-attr]
        out = _read_logs(shares[0], keep)
        for share, child in zip(shares[1:], children):
            data = child.stdout.read()  # type: ignore[union-attr]
            read = _unpickled(data) if child.wait() == 0 else None
            out += read if read is not None else _read_logs(share, keep)
        return out
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]


def _unpickled(data: bytes) -> list[EventLog | str] | None:
    """A reading process's share as it sent it, or None if its output is not one (a process that
    failed, or something else that wrote to its stdout)."""
    try:
        share = pickle.loads(data)  # noqa: S301 -- written by our own child process, not read from a file
    except Exception:  # noqa: BLE001 -- bytes that are not a pickle fail in many ways; the share is read again
        return None
    return share if isinstance(share, list) else None


def _serve() -> None:
    """A reading process (:func:`_read_in_processes`): ``argv[1]`` names ``keep`` (``module:name``),
    ``argv[2]`` is the parent's pid, stdin the files (NUL-separated); the pickled result on stdout."""
    _end_with_parent(int(sys.argv[2]))
    module, _, qualname = sys.argv[1].partition(":")
    keep: Any = importlib.import_module(module)
    for part in qualname.split("."):
        keep = getattr(keep, part)
    files = [Path(os.fsdecode(f)) for f in sys.stdin.buffer.read().split(b"\0")]
    with _no_gc():
        sys.stdout.buffer.write(pickle.dumps(_read_logs(files, keep), protocol=pickle.HIGHEST_PROTOCOL))


def _end_with_parent(parent: int) -> None:
    """This reading process is killed when ``parent``, the process that started it, ends (Linux):
    a report stopped by a signal leaves no process reading on; if it ended before this was set
    up, this process ends here."""
    with contextlib.suppress(OSError, AttributeError, TypeError):  # not Linux: no prctl
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)
