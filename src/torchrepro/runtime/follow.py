"""Capture follows the job: every process below a captured one that becomes a rank captures itself.

Lightning starts ranks 1.. as subprocesses, ``torch.multiprocessing.spawn`` and ``accelerate
launch`` start every rank below a process that is no rank at all. :func:`propagate` (called by
``torchrepro run`` once its own capture runs) puts ``_bootstrap/`` first on ``PYTHONPATH`` and the
capture configuration in ``TORCHREPRO_FOLLOW``; the ``sitecustomize`` there starts capture in a
process that a launcher made a rank (:func:`activate_at_start`) and otherwise only wraps
``torch.distributed.init_process_group``, so that a process starts capture when it joins a process
group (:func:`hook_process_group`). Whoever captures records the group it joined as a
:class:`~torchrepro.eventlog.events.World` event and marks its rank variables as seen
(``TORCHREPRO_FOLLOW_SEEN``): its own children inherit them and are not ranks (DataLoader and
compile workers, helpers).

The process ``torchrepro`` launched writes ``rank-0/`` until a descendant joins a group as rank 0
while it never did (``mp.spawn``, ``accelerate launch``): its log then moves to ``launcher/``. A
launcher that runs the script in one child process of its own, no rank and no process group
(``accelerate launch --cpu``, or without a multi-process option: its simple launcher), marks that
child (``TORCHREPRO_FOLLOW_CHILD``, set by :func:`propagate` where the launched program is one of
:data:`CHILD_LAUNCHERS`): the child captures itself from its start as rank 0, and the launcher's
log moves to ``launcher/`` as well.

A process that ``torch.multiprocessing.spawn`` (or ``start_processes``) starts is a rank-to-be
whose rank only the process group will say: the captured process marks it (``TORCHREPRO_FOLLOW_SPAWN``
while it starts processes, :func:`hook_spawn`), and it is prepared at interpreter start as a
torchrun rank is (``--seed``, a drift run's factor levels, compile mode: :func:`prepare_spawned`);
the seed plan takes its rank from the group when it joins. The whole capture configuration
travels (a replay's step and record, a fix), so ``check``'s replays reach these ranks too.
Importing this module does not import torch.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import socket
import sys
import traceback
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NoReturn, TypedDict

from .. import _state
from .._dist import from_env, placement

if TYPE_CHECKING:  # imported where used: a followed process starts without them
    from ..capture.session import CaptureSession
    from ..seed import SeedPlan
    from .run_options import RunOptions

CONFIG_VAR = "TORCHREPRO_FOLLOW"
SEEN_VAR = "TORCHREPRO_FOLLOW_SEEN"
SPAWN_VAR = "TORCHREPRO_FOLLOW_SPAWN"  # as in _bootstrap/sitecustomize.py
CHILD_VAR = "TORCHREPRO_FOLLOW_CHILD"  # as in _bootstrap/sitecustomize.py: the pid whose direct child is rank 0
# programs that run the training script in a child process of their own when they start one process
# (their console scripts, by name): accelerate's CLI (its simple launcher: `accelerate launch --cpu`)
CHILD_LAUNCHERS = ("accelerate", "accelerate-launch")
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # as in _bootstrap/sitecustomize.py
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "_bootstrap"
LAUNCHER_DIR = "launcher"
_WRAPPED = "__torchrepro_follows__"


@dataclass
class _Prepared:
    """How this process was prepared before its rank was known (:func:`torchrepro._state.kept`)."""

    plan: SeedPlan | None = None  # the seed plan made then: it takes the rank of a group joined later
    spawned: bool = False  # a rank-to-be that torch.multiprocessing spawned, seeded at its start


_PREPARED = _state.kept(_Prepared)


def _note(text: str) -> None:
    print(f"torchrepro: note: {text} (process {os.getpid()})", file=sys.stderr)


def _mark_seen() -> None:
    """Children that inherit this process's rank variables are its helpers, not ranks."""
    os.environ[SEEN_VAR] = ":".join(os.environ.get(name, "") for name in RANK_VARS)


def follow_env(options: RunOptions, root_pid: int, pythonpath: str = "") -> dict[str, str]:
    """The variables that make a process (and those it starts) capture itself as ``options`` (a
    :class:`~torchrepro.runtime.run_options.RunOptions`, its run directory set) say once it becomes a rank:
    the same capture, seed, compile mode, cache, replay, fix and drift factor levels;
    ``root_pid`` is the launched process, ``pythonpath`` the ``PYTHONPATH`` to extend."""
    path = [p for p in pythonpath.split(os.pathsep) if p and p != str(BOOTSTRAP_DIR)]
    return {
        CONFIG_VAR: json.dumps({"options": options.absolute().to_json(), "root_pid": root_pid}),
        "PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), *path]),
    }


def propagate(options: RunOptions, script: Path | None = None) -> None:
    """Make every process the script starts capture itself once it becomes a rank (``options``:
    the :class:`~torchrepro.runtime.run_options.RunOptions` of this process), and record the process
    group this process joins. ``script``: the program this process runs; one of :data:`CHILD_LAUNCHERS`
    has its direct child captured as rank 0 (the module docstring)."""
    from ..seed import active_plan

    os.environ.update(follow_env(options, os.getpid(), os.environ.get("PYTHONPATH", "")))
    if script is not None and script.name in CHILD_LAUNCHERS:
        os.environ[CHILD_VAR] = str(os.getpid())
    _PREPARED.value.plan = active_plan()  # made before the script ran
    _mark_seen()
    hook_process_group()
    hook_spawn()


def without_follow(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a new, separately captured run: nothing inherited from a capture around it."""
    return {k: v for k, v in env.items() if k not in (CONFIG_VAR, SEEN_VAR, SPAWN_VAR, CHILD_VAR)}


def _config() -> tuple[RunOptions, int]:
    """The run options of the launched process and its pid."""
    from .run_options import RunOptions

    data = json.loads(os.environ[CONFIG_VAR])
    return RunOptions.from_json(data["options"]), int(data["root_pid"])


def _prepare(options: RunOptions) -> None:
    """``prepare.prepare``; remembers the seed plan it makes, whose rank the process group will say
    (:func:`_joined`)."""
    from .prepare import prepare
    from ..seed import active_plan

    prepare(options)
    _PREPARED.value.plan = active_plan()


def activate_at_start(rank: int, rank_from: str = "env") -> None:
    """Capture this process as ``rank`` from its start, prepared as ``torchrepro run`` prepares
    its own (cache policy, compile mode, seed); called by the bootstrap ``sitecustomize``.
    ``rank_from``: ``env`` (a launcher's rank variables), ``launcher_child`` (the one child of a
    :data:`CHILD_LAUNCHERS` program)."""
    options, root_pid = _config()
    _prepare(options)
    here = from_env()
    local = rank if here.local_rank is None else here.local_rank
    _start(options, root_pid, (rank, here.world_size, local), rank_from)
    _mark_seen()
    hook_process_group()
    hook_spawn()


def prepare_spawned() -> None:
    """A process ``torch.multiprocessing`` spawned for the captured one (see :func:`hook_spawn`):
    prepared now as a torchrun rank is at its start (seeded with ``--seed`` before the script's
    module is imported again); capture starts when it joins a process group. Called by the
    bootstrap ``sitecustomize``."""
    options, _ = _config()
    _prepare(options)
    _PREPARED.value.spawned = True


def hook_spawn() -> None:
    """Wrap ``torch.multiprocessing.start_processes`` (``spawn`` calls it) so that the processes it
    starts know they are spawned ranks-to-be (``TORCHREPRO_FOLLOW_SPAWN`` while it runs)."""
    spawn = sys.modules.get("torch.multiprocessing.spawn")
    original = getattr(spawn, "start_processes", None)
    if original is None or getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def start_processes(*args: Any, **kwargs: Any) -> Any:
        had = os.environ.get(SPAWN_VAR)
        os.environ[SPAWN_VAR] = "1"
        try:
            return original(*args, **kwargs)
        finally:
            if had is None:
                os.environ.pop(SPAWN_VAR, None)

    setattr(start_processes, _WRAPPED, True)
    for module in (spawn, sys.modules.get("torch.multiprocessing")):
        if getattr(module, "start_processes", None) is original:
            setattr(module, "start_processes", start_processes)


def hook_process_group() -> None:
    """Wrap ``init_process_group`` wherever torch.distributed has put it so far (once)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    original = getattr(c10d, "init_process_group", None)
    if original is None or getattr(original, _WRAPPED, False):
        return
    wrapped = _after(original, _joined)
    for name, module in list(sys.modules.items()):
        if name.startswith("torch") and getattr(module, "init_process_group", None) is original:
            setattr(module, "init_process_group", wrapped)


def _after(function: Callable[..., Any], then: Callable[[], None]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        try:
            then()
        except Exception as exc:  # observation never breaks the user's script
            _note(f"capture could not record the process group: {type(exc).__name__}: {exc}")
        return result

    setattr(wrapper, _WRAPPED, True)
    return wrapper


def _own_session() -> CaptureSession | None:
    from ..capture.session import active_session

    session = active_session()
    return session if session is not None and session.pid == os.getpid() else None  # not a forked parent's


def _joined() -> None:
    """After ``init_process_group``: record the world; a process not captured yet starts now."""
    import torch.distributed as dist

    from ..eventlog.events import World

    here = placement()
    world = World(
        group_rank=here.rank,
        world_size=here.world_size,
        local_rank=here.local_rank,
        node=here.node,
        host=socket.gethostname(),
        backend=str(dist.get_backend()),
    )
    session = _own_session()
    if session is None and CONFIG_VAR in os.environ:
        options, root_pid = _config()
        from .prepare import apply_compile_mode

        if not _PREPARED.value.spawned:  # no seeding: the script has run; seeding now would change it
            apply_compile_mode(options.compile_mode)
        rank = (
            world.group_rank,
            world.world_size,
            world.local_rank if world.local_rank is not None else world.group_rank,
        )
        session = _start(options, root_pid, rank, "process_group")
    if session is not None:
        session.joined(world)
    _rank_the_plan(world.group_rank, world.world_size)
    _mark_seen()


def _rank_the_plan(rank: int, world_size: int) -> None:
    """The seed plan made before this process knew its rank takes the group's (per-rank streams:
    DataLoader workers, ``plan.fork``); a plan the script made itself is left as it is."""
    from ..seed import active_plan

    plan = active_plan()
    if plan is _PREPARED.value.plan and plan is not None:
        plan.rank, plan.world_size = rank, world_size


def claim(run_dir: Path, rank: int, root_pid: int) -> bool:
    """Make ``run_dir/rank-<rank>`` this process's: new, or held by the launched process (``root_pid``)
    as the rank 0 it assumed but never joined a group as (its log then moves to ``launcher/``)."""
    from ..eventlog.event_reader import read_header
    from ..eventlog.events import EVENTS_FILE

    target = run_dir / f"rank-{rank}"
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        target.mkdir()
        return True
    except FileExistsError:
        pass
    log = target / EVENTS_FILE
    header = read_header(log)
    if (
        header is None
        or header.pid != root_pid
        or header.config.get("rank_from") != "default"
        or b'"kind":"world"' in log.read_bytes()
    ):
        return False
    moved, n = run_dir / LAUNCHER_DIR, 1
    while moved.exists():
        n += 1
        moved = run_dir / f"{LAUNCHER_DIR}-{n}"
    try:
        os.rename(target, moved)  # the launched process keeps writing through its open files
        target.mkdir()
    except OSError:
        return False
    return True


def _start(options: RunOptions, root_pid: int, rank: tuple[int, int, int], rank_from: str) -> CaptureSession | None:
    from ..capture.session import CaptureSession
    from ..telemetry.otlp import live_listeners

    config = options.capture_config()
    if not claim(config.run_dir, rank[0], root_pid):
        _note(f"rank {rank[0]} of this job is already captured by another process; this one is not")
        return None
    session = CaptureSession(config, rank=rank, rank_from=rank_from, listeners=live_listeners())
    session.start()
    _end_at_exit(session)
    return session


class _Outcome(TypedDict):
    code: int
    error: str | None


def _end_at_exit(session: CaptureSession) -> None:
    """Write the end event when the interpreter exits, with the exit code ``sys.exit`` was given
    and the exception that ended the script (also the one ``torch.multiprocessing.spawn``'s worker
    wrapper catches before its ``sys.exit(1)``)."""
    outcome: _Outcome = {"code": 0, "error": None}
    real_exit, real_hook = sys.exit, sys.excepthook

    def record(code: int, exc: BaseException | None) -> None:
        outcome["code"] = code
        if not code:
            outcome["error"] = None
        elif exc is not None and not isinstance(exc, SystemExit):
            outcome["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        elif outcome["error"] is None:
            outcome["error"] = f"SystemExit({code})"

    def exit(code: Any = None) -> NoReturn:
        record(code if isinstance(code, int) else (0 if code is None else 1), sys.exc_info()[1])
        real_exit(code)

    def excepthook(kind: type, value: BaseException, tb: Any) -> None:
        record(1, value)
        real_hook(kind, value, tb)

    sys.exit, sys.excepthook = exit, excepthook
    atexit.register(lambda: session.stop(outcome["code"], outcome["error"]))
