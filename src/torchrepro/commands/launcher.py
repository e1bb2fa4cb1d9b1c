"""The supervisor's side of a run: start a user's script under capture in fresh child processes
(``doctor``, ``check``, ``check-resume``, ``drift``), show and keep their output, forward stop
signals, and end them. One way to spawn (:func:`spawn`: its own process group, killed with
torchrepro), watch (:class:`Job`) and end (:func:`end_jobs`) a job. What runs inside the child
(``torchrepro run``) is :mod:`torchrepro.runtime.runner`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from .. import _state
from ..errors import InputError, Stopped
from ..telemetry.otlp import launch_span
from ..runtime.run_options import RunOptions
from ..runtime.runner import die_with_parent, libc_prctl

STDERR_TAIL_LINES = 40


def validate_script(script: str | os.PathLike[str]) -> Path:
    """The script's path, or an :class:`InputError` if it is missing or does not parse."""
    path = Path(script)
    if not path.is_file():
        raise InputError(f"no such script: {script}")
    try:
        source = path.read_bytes()
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise InputError(f"{path}:{exc.lineno}: syntax error: {exc.msg}; nothing was run") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    return path


@dataclass
class ChildResult:
    """How a launched run ended: its exit code, the tail of its stderr, and for several ranks each
    rank's exit code (negative: killed by that signal) and stderr tail, whether it stalled (or was
    ended by the stall timeout before any rank started: ``not_started_within_s``), and the signal
    (``"SIGTERM"``) sent to torchrepro that stopped it."""

    exit_code: int
    stderr_tail: list[str] = field(default_factory=list)
    rank_exit_codes: dict[int, int] = field(default_factory=dict)
    rank_stderr_tails: dict[int, list[str]] = field(default_factory=dict)
    stalled_after_s: float | None = None
    stopped_by: str | None = None
    not_started_within_s: float | None = None


def _pump(source: IO[bytes], sinks: list[IO[bytes]], tail: deque[str] | None) -> None:
    for line in iter(source.readline, b""):
        for sink in sinks:
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass
        if tail is not None:
            tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    source.close()


def _last_progress(run_dir: Path, since: float) -> float:
    """When a rank last wrote an event (the launch time before any did): a line to its
    events.jsonl or a step record to its steps.bin."""
    times = []
    for path in (*run_dir.glob("rank-*/events.jsonl"), *run_dir.glob("rank-*/steps.bin")):
        with contextlib.suppress(OSError):  # a rank's directory being created or removed
            times.append(path.stat().st_mtime)
    return max([since, *times])


def _rank_pids(run_dir: Path) -> list[int]:
    from ..eventlog.event_reader import read_header

    pids = []
    for path in run_dir.glob("rank-*/events.jsonl"):
        header = read_header(path)
        if header is not None and header.pid:
            pids.append(header.pid)
    return pids


GRACE_S = 5.0  # between SIGTERM and SIGKILL when a job is ended
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_PRCTL = libc_prctl()  # resolved before any fork (see die_with_parent)


def _proc_table() -> dict[int, tuple[int, int, int, bool]] | None:
    """Every process as ``pid -> (ppid, pgid, start time, zombie)`` from ``/proc`` (None without one)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    table = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[2]), int(fields[19]), fields[0] == "Z")
        except (OSError, IndexError, ValueError):
            continue
    return table


class Job:
    """A job started by :func:`spawn`: the child (leader of its own process group) and every
    descendant seen while it ran (pid and start time), so that processes which left the group
    (``start_new_session=True`` in the script, torchrun's ranks) are ended with it where this
    system shows them (``/proc``)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.pgid = proc.pid
        self.seen: dict[int, int] = {}  # pid -> start time (a reused pid is not another's)

    def watch(self) -> None:
        """Record the job's descendants as they are now (children of the child, and of any seen before)."""
        table = _proc_table()
        if table is None:
            return
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_rest) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.proc.pid, *self._alive(table)]
        while todo:
            for child in children.get(todo.pop(), ()):
                if child not in self.seen and child != self.proc.pid:
                    self.seen[child] = table[child][2]
                    todo.append(child)

    def _alive(self, table: dict[int, tuple[int, int, int, bool]]) -> list[int]:
        return [pid for pid, start in self.seen.items() if pid in table and table[pid][2:] == (start, False)]

    def alive(self) -> bool:
        """Whether any process of the job's group, or a descendant seen, still runs (zombies do not count)."""
        table = _proc_table()
        if table is None:
            try:
                os.killpg(self.pgid, 0)
            except OSError:
                return False
            return True
        return bool(self._alive(table)) or any(pgid == self.pgid and not z for _, pgid, _, z in table.values())

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the job's group and to every descendant seen that still runs."""
        _signal_group(self.pgid, sig)
        table = _proc_table() or {}
        for pid in self._alive(table):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
GUARDIAN = Path(__file__).with_name("_guardian.py")
_guardian_lock = threading.Lock()


@dataclass
class _LauncherState:
    """What this module keeps for the life of the process, kept on reset: the guardian is a
    running process holding this one's pipe, which forgetting would leave behind."""

    guardian: tuple[int, subprocess.Popen[bytes], int] | None = None  # (for pid, its Popen, the pipe's write end)
    # what the stop-signal handlers share, in any thread: the jobs being waited for, the stop
    # signals taken while the handlers were installed, the phases open (stop_phase, side_by_side:
    # a stop taken waits for them to end their jobs)
    running: list[_ForwardStops] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)


_LAUNCHER = _state.kept(_LauncherState, survives_reset=True)


def _guard() -> None:
    """Start the guardian (:mod:`torchrepro.commands._guardian`) of this torchrepro process unless
    it runs: it ends whatever this process started once it is gone, however it ends. Its stdin is
    the read end of a pipe whose write end only this process holds, never written (``os.pipe``
    makes both ends non-inheritable: no job gets a copy that would keep the pipe open): the
    kernel closes it when this process ends. In a session of its own: a signal to torchrepro's
    process group (Ctrl-C, ``kill -- -PGID``) spares it. Linux (``/proc``) only."""
    with _guardian_lock:
        guardian = _LAUNCHER.value.guardian
        if guardian is not None and guardian[0] == os.getpid() and guardian[1].poll() is None:
            return
        if not os.path.isdir("/proc/self/task"):
            return
        if guardian is not None and guardian[0] == os.getpid():
            os.close(guardian[2])  # (a guardian someone killed: its pipe is of no use)
        read, write = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(GUARDIAN), str(os.getpid())],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            os.close(write)
            raise
        finally:
            os.close(read)
        _LAUNCHER.value.guardian = (os.getpid(), proc, write)


def _prepare_job(parent: int, prctl: Callable[..., int]) -> None:
    """In the job's first process, before it runs ``cmd``: die with ``parent``'s thread
    (:func:`die_with_parent`), and adopt the processes orphaned below it (Linux
    ``PR_SET_CHILD_SUBREAPER``, kept across ``exec``): a daemon the script double-forks stays in
    the job's tree, seen and ended with the job (:meth:`Job.watch`) and by the guardian, instead
    of going to init unseen."""
    die_with_parent(parent, prctl)
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def spawn(
    cmd: list[str],
    *,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Job:
    """Start ``cmd`` as a job: in its own session (process group), killed by the kernel when the
    calling thread ends (Linux ``PR_SET_PDEATHSIG``: a torchrepro killed with SIGKILL leaves no
    job running; the caller waits for it in that thread), the orphans of its tree kept in it, and
    all of it ended by this process's guardian once this process is gone (:func:`_guard`).
    ``stdin``, ``stdout``, ``stderr``, ``env``, ``cwd``: as :class:`subprocess.Popen`'s."""
    _guard()
    parent = os.getpid()
    preexec = None if _PRCTL is None else partial(_prepare_job, parent, _PRCTL)
    proc = subprocess.Popen(
        cmd, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd, start_new_session=True, preexec_fn=preexec
    )
    return Job(proc)


def wait_job(job: Job, every: Callable[[], None] | None = None, tick: float = 0.5) -> int:
    """Wait for the job's child to exit, recording its descendants (and calling ``every``) each
    ``tick`` s meanwhile; its exit code. Whatever it leaves running is the caller's to end
    (:func:`end_jobs`)."""
    while True:
        try:
            return job.proc.wait(timeout=tick)
        except subprocess.TimeoutExpired:
            job.watch()
            if every is not None:
                every()


def end_jobs(jobs: Iterable[Job], grace: float = GRACE_S) -> None:
    """End every process left in ``jobs`` (their groups and the descendants seen): SIGTERM, then
    SIGKILL after ``grace`` s; the children are reaped."""
    jobs = list(jobs)
    for job in jobs:
        job.watch()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [job for job in jobs if job.alive()]
        if not live:
            break
        for job in live:
            job.signal(sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(job.alive() for job in live):
            time.sleep(0.05)
    for job in jobs:
        try:
            job.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def wait_stoppable(job: Job, every: Callable[[], None] | None = None) -> tuple[int, str | None]:
    """:func:`wait_job` with the stop signals to torchrepro forwarded to the job
    (:class:`_ForwardStops`: SIGKILL :data:`GRACE_S` s later or at a second signal; ``every`` is no
    longer called once stopped): its exit code, and the name of the signal that stopped it (None:
    none did)."""
    with _ForwardStops(job) as stops:

        def check() -> None:
            if stops.overdue():
                job.signal(signal.SIGKILL)
            elif stops.signum is None and every is not None:
                every()

        code = wait_job(job, check)
    return code, stops.name


def _stop_stalled(job: Job, run_dir: Path) -> None:
    """Ask every rank for its Python stacks (SIGUSR1 → faulthandler), then end the job."""
    for pid in _rank_pids(run_dir):
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(2.0)
    end_jobs([job])


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:  # the group is gone
        pass


class _ForwardStops:
    """While a job runs, SIGINT/SIGTERM/SIGHUP sent to torchrepro stop the whole job (the same signal
    to its process group, SIGKILL after :data:`GRACE_S` s or at a second signal) instead of leaving
    it running; the run is then recorded as stopped and its report written. Jobs waited for in
    other threads (:func:`side_by_side`, :func:`stop_phase`) are stopped too: the main thread's
    handlers (installed by the command, :func:`stop_signals`, else by the first job waited for
    there, :func:`side_by_side` or :func:`stop_phase`) forward to every job running."""

    def __init__(self, job: Job):
        self.job = job
        self.signum: int | None = None
        self.since: float | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _ForwardStops:
        _LAUNCHER.value.running.append(self)
        if threading.current_thread() is threading.main_thread():
            self._previous = _forward_signals()
        if (
            _LAUNCHER.value.taken
        ):  # a job started after a stop signal (beside others, in a stop_phase): it stops at once
            self._on_signal(_LAUNCHER.value.taken[0], None)
        return self

    def __exit__(self, *exc: object) -> None:
        _LAUNCHER.value.running.remove(self)
        _restore_signals(self._previous)

    def _on_signal(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        if first:
            self.signum, self.since = signum, time.monotonic()
        _signal_group(self.job.pgid, signum if first else signal.SIGKILL)

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def overdue(self) -> bool:
        return self.since is not None and time.monotonic() - self.since > GRACE_S


def _forward_signals() -> dict[int, Any]:
    """Install (main thread) the handlers that forward a stop signal to every job running; the
    handlers they replace, for :func:`_restore_signals` (none when they are installed already: by
    the command, :func:`stop_signals`, or an outer phase, which keeps the stop it took)."""
    previous = {}
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            sig = getattr(signal, name)
            if signal.getsignal(sig) is not _on_stop:
                previous[sig] = signal.signal(sig, _on_stop)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`_forward_signals` replaced, forgetting the stop it forwarded."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    if previous:
        _LAUNCHER.value.taken.clear()


def _on_stop(signum: int, frame: Any) -> None:
    """A stop signal: forwarded to every job running; with none running and no phase open (the
    command between jobs, or one that starts none), the command ends here (:class:`Stopped`)."""
    _LAUNCHER.value.taken.append(signum)
    running = list(_LAUNCHER.value.running)
    for stops in running:
        stops._on_signal(signum, frame)
    if not running and not _LAUNCHER.value.phases:
        name = signal.Signals(signum).name
        raise Stopped(f"stopped by {name}", name)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """A command's lifetime (``torchrepro COMMAND``, all but ``run``, whose ranks record their own
    end): SIGINT, SIGTERM and SIGHUP to torchrepro are handled alike, forwarded to the jobs running
    (:class:`_ForwardStops`), else ending the command with :class:`Stopped` (one line, exit 128 + N)."""
    previous = _forward_signals() if threading.current_thread() is threading.main_thread() else {}
    try:
        yield
    finally:
        _restore_signals(previous)


def stop_received() -> str | None:
    """The name of the stop signal taken (None: none yet). A phase checks it before it starts
    another job."""
    return signal.Signals(_LAUNCHER.value.taken[0]).name if _LAUNCHER.value.taken else None


@contextlib.contextmanager
def stop_phase(what: str) -> Iterator[None]:
    """A long phase of a command whose jobs are waited for in other threads (``what``: doctor's fix
    runs, drift's runs): a stop signal is forwarded to every job running (:class:`_ForwardStops`),
    also to one started later, and the phase goes on to its end: it checks :func:`stop_received`
    before each job, writes what finished and raises :class:`~torchrepro.errors.Stopped` (exit
    128 + N). A stop it did not turn into an error is raised here as it ends."""
    previous = _forward_signals() if threading.current_thread() is threading.main_thread() else {}
    taken = len(_LAUNCHER.value.taken)
    _LAUNCHER.value.phases.append(what)
    try:
        yield
    finally:
        _LAUNCHER.value.phases.remove(what)
        stopped = signal.Signals(_LAUNCHER.value.taken[taken]).name if len(_LAUNCHER.value.taken) > taken else None
        _restore_signals(previous)
    if stopped:
        raise Stopped(f"{what}: stopped by {stopped}", stopped)


def side_by_side(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each of ``calls`` (each launching and waiting for its own job) in a thread of its own, all
    at once; their results in order, or the first one's exception. A stop signal to torchrepro
    reaches every job (:class:`_ForwardStops`), also one started after it, each call ending as it
    would alone."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def call(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 -- handed to the main thread, raised there
            errors[i] = exc

    previous = _forward_signals() if threading.current_thread() is threading.main_thread() else {}
    _LAUNCHER.value.phases.append("side by side")
    try:
        threads = [threading.Thread(target=call, args=(i,), name=f"torchrepro-run-{i}") for i in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():  # (a join with a timeout lets the main thread take signals)
                thread.join(timeout=0.2)
    finally:
        _LAUNCHER.value.phases.remove("side by side")
        _restore_signals(previous)
    for error in errors:
        if error is not None:
            raise error
    return results


def run_child(
    cmd: list[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    stall_timeout: float | None = None,
    run_dir: Path | None = None,
    cwd: Path | None = None,
) -> ChildResult:
    """Run ``cmd`` as a job (:func:`spawn`), showing its output live (unless ``quiet``) and
    keeping it in ``log_dir/stdout.log`` and ``stderr.log``. With ``stall_timeout``, a job
    whose ranks write no event into ``run_dir`` for that many seconds has its stacks dumped and is
    ended; ended so before any rank started (no rank's log in ``run_dir``), it did not stall but never
    started (``not_started_within_s``: the script did not fail, it never ran). A stop signal sent to torchrepro is forwarded to the job (see :class:`_ForwardStops`);
    whatever the job leaves running when it ends (a subprocess of the script) is ended too."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    stalled = not_started = None
    with open(log_dir / "stdout.log", "wb") as out_log, open(log_dir / "stderr.log", "wb") as err_log:
        started = time.time()
        job = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
        proc = job.proc
        out_sinks = [out_log] if quiet else [out_log, sys.stdout.buffer]
        err_sinks = [err_log] if quiet else [err_log, sys.stderr.buffer]
        pumps = [
            threading.Thread(target=_pump, args=(proc.stdout, out_sinks, None), daemon=True),
            threading.Thread(target=_pump, args=(proc.stderr, err_sinks, tail), daemon=True),
        ]
        for pump in pumps:
            pump.start()

        def check() -> None:
            nonlocal stalled, not_started
            if stall_timeout is not None and run_dir is not None:
                quiet_for = time.time() - _last_progress(run_dir, started)
                if quiet_for > stall_timeout:
                    if any(run_dir.glob("rank-*/events.jsonl")):
                        stalled = round(quiet_for, 1)
                    else:  # what the launcher prints as it is ended (torchrun's traceback) is no cause: kept in the logs only
                        not_started = round(quiet_for, 1)
                        del out_sinks[1:], err_sinks[1:]
                    _stop_stalled(job, run_dir)

        try:
            code, stopped_by = wait_stoppable(job, check)
        finally:
            end_jobs([job])  # the script's own subprocesses, and the job itself on any error here
        for pump in pumps:  # a process that left the group may still hold the pipes: do not wait for it
            pump.join(timeout=2)
    return ChildResult(
        code, list(tail), stalled_after_s=stalled, stopped_by=stopped_by, not_started_within_s=not_started
    )


_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)


def torchrun_failures(stderr: str) -> dict[int, int]:
    """Each failed rank's exit code from torchrun's failure summary (negative: signal)."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(stderr)}


def launch(
    run_dir: Path,
    script: Path,
    args: list[str],
    options: RunOptions,
    *,
    nproc: int = 1,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    stall_timeout: float | None = None,
    cwd: Path | None = None,
) -> ChildResult:
    """Run ``script`` under capture in fresh processes: one, or ``nproc`` ranks through torchrun
    (standalone rendezvous, gloo/NCCL as the script chooses), each set up as ``options`` say and
    writing into ``run_dir``. ``env``: the children's environment (None: ours); ``cwd``: their
    working directory (None: ours; :mod:`torchrepro.commands.workdir`)."""
    if cwd is not None:  # what the run is told is found from its own working directory
        run_dir, options = run_dir.resolve(), options.absolute()
    run_cmd = run_command(script, args)
    if nproc > 1:
        logs = run_dir / "torchrun"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            "--log-dir",
            str(logs),
            "--tee",
            "3",
            *run_cmd[1:],
        ]
    else:
        cmd = run_cmd
    env = {**(os.environ if env is None else env), **replace(options, run_dir=run_dir).env()}
    with launch_span(run_dir, nproc) as trace:  # --otlp-endpoint: one span per launch, its context to every rank
        result = run_child(
            cmd,
            run_dir / "logs",
            env=trace.child_env(env),
            quiet=quiet,
            stall_timeout=stall_timeout,
            run_dir=run_dir,
            cwd=cwd,
        )
        trace.exit_code = result.exit_code
    if nproc > 1:
        result.rank_exit_codes = torchrun_failures((run_dir / "logs" / "stderr.log").read_text(errors="replace"))
        for rank in range(nproc):
            files = sorted((run_dir / "torchrun").glob(f"*/attempt_*/{rank}/stderr.log"))
            if files:
                lines = files[-1].read_text(errors="replace").splitlines()
                result.rank_stderr_tails[rank] = lines[-STDERR_TAIL_LINES:]
    else:
        result.rank_stderr_tails[0] = result.stderr_tail
        if result.exit_code:
            result.rank_exit_codes[0] = result.exit_code
    return result


def run_command(script: Path, args: list[str]) -> list[str]:
    """The ``python -m torchrepro run -- SCRIPT -- ARGS`` command line of a child process (every
    argument the script's, its options too); its :class:`RunOptions` go in its environment
    (:meth:`RunOptions.env`), a module run as ``python -m`` runs it among them (``module``: SCRIPT is
    then its file, what the report names)."""
    return [sys.executable, "-m", "torchrepro", "run", "--", str(script), "--", *args]


# An idle OpenMP thread of torch's CPU build (GNU OpenMP) spins for a while before it sleeps: alone, a
# run loses nothing by it; beside another run on the same cores, the spinning takes the time the other
# needs (check's two runs on 2 cores: 1.4x one plain run's wall with it, 1.03x without; docs/evidence/performance.md).
# How an idle thread waits changes neither the number of threads nor how an op splits its work: no result.
SHARING_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def sharing_cores_env() -> dict[str, str]:
    """What a job started beside others gets in its environment: :data:`SHARING_CORES_ENV`, less
    what the user set (theirs stands)."""
    return {name: value for name, value in SHARING_CORES_ENV.items() if name not in os.environ}


def child_env(seed: int | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child run: ours (less a capture around us, see :mod:`torchrepro.runtime.follow`),
    plus ``PYTHONHASHSEED`` when seeding."""
    from ..runtime.follow import without_follow

    env = without_follow(dict(os.environ))
    if seed is not None:
        env["PYTHONHASHSEED"] = str(seed % 2**32)
    env.update(extra or {})
    return env
