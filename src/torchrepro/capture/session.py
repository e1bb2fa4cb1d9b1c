"""One capture session per process: the event log, its header and end, and the observers."""

from __future__ import annotations

import errno
import faulthandler
import os
import platform
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from .. import _dist, _state
from .._compat import undo_patches, watch
from ..eventlog.event_writer import EventWriter, ReservedEnd
from ..eventlog.events import EVENTS_FILE, CacheLookup, Capability, Compile, End, Event, Header, World
from ..eventlog.payloads import JsonObject
from .compile_events import CompileCapture
from .steps import StepConfig, StepRecorder


@dataclass
class CaptureConfig:
    """Where events go and what is recorded."""

    run_dir: Path
    steps: StepConfig = field(default_factory=StepConfig)
    seed: int | None = None
    compile_mode: str | None = None  # None (as written) | "eager" | "fallback-random"
    replay_step: int | None = None  # record this step (capture.ops), then exit
    replay_out: Path | None = None
    replay_graphs: bool = False  # compare compiled graphs with their eager FX graphs instead of ops
    replay_kernels: bool = False  # repeat each compiled graph (forward and backward) on identical inputs instead
    stop_after_step: int | None = None  # end the script cleanly (exit 0) after this step
    probe_repeats: int = 0  # call each compiled graph again this many times after its first step (not in replays)
    probe_against_eager: bool = False  # the probe also compares each graph with its FX graph run eagerly


def environment() -> tuple[JsonObject, str]:
    """What changes numerics or cache keys in this process (the header's ``env``), and its fingerprint."""
    from .environment import collect

    info = collect()
    env: JsonObject = dict(info)  # Header.env: open JSON (a log another version wrote may differ)
    return env, info["env_fingerprint"]


_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def active_session() -> CaptureSession | None:
    """The capture session running in this process, if any."""
    return cast("CaptureSession | None", _state.session())  # (only a CaptureSession records itself there)


class CaptureSession:
    """Start before the user's script, stop after it (also when it fails)."""

    def __init__(
        self,
        config: CaptureConfig,
        rank: tuple[int, int, int] | None = None,
        rank_from: str | None = None,
        listeners: Sequence[Callable[[Event], None]] = (),
    ):
        """``rank``: (rank, world size, local rank) when known otherwise than from the torchrun
        environment; ``rank_from`` says where it came from (``env``, ``process_group``, or
        ``default``: rank 0 of 1 because nothing said otherwise); ``listeners`` get every event
        written (the launcher's live OpenTelemetry export, :func:`torchrepro.telemetry.otlp.live_listeners`)."""
        self.config = config
        self.listeners = list(listeners)
        self.rank, self.world_size, self.local_rank = rank or (_dist.rank(), _dist.world_size(), _dist.local_rank())
        self.rank_from = rank_from or _dist.placement().source
        self.dir = Path(config.run_dir) / f"rank-{self.rank}"
        self.writer: EventWriter | None = None
        self.reserved: ReservedEnd | None = None  # room for the end record when the log cannot take it
        self.steps: StepRecorder | None = None
        self.compiles: CompileCapture | None = None
        self._lock = threading.Lock()
        self._stacks: Any = None
        self.pid = os.getpid()
        self._t0 = time.time()
        self._unwatch: Any = None
        self.prober: Any = None  # capture.graph_probe.GraphProber, with probe_repeats
        self._cancel_prober: Callable[[], None] = lambda: None
        self._stopping = False  # stop() is writing the end record
        self._deferred: int | None = None  # a stop signal that arrived meanwhile, raised once it is written

    @property
    def run_dir(self) -> Path:
        """The run directory this session writes its rank's log into."""
        return Path(self.config.run_dir)

    def restart_steps_at(self, step: int) -> None:
        """Number the next step ``step + 1`` (a run resumed from a checkpoint)."""
        if self.steps is not None:
            self.steps.restart_at(step)

    def emit(self, event: Event) -> None:
        if self.writer is None or _state.pid() != self.pid:  # DataLoader workers fork us: stay quiet there
            return
        event.rank = self.rank
        if isinstance(event, Compile) and self.steps is not None:
            self.steps.note_compile()
        elif isinstance(event, CacheLookup) and self.prober is not None:
            self.prober.mark_miss(event)
        with self._lock:
            try:
                self.writer.write(event)
            except OSError as exc:  # a full disk, a quota: capture stops, the user's run goes on
                self._stop_writing(exc)

    def emit_step(
        self, t: float, index: int, loss: float | None, backward_calls: int, time_s: float, compiles: int
    ) -> bool:
        """A common step written from its values (:meth:`EventWriter.write_step`: the step hook's
        fast path, no ``Step`` built); False when :meth:`emit` must take its ``Step`` instead."""
        writer = self.writer
        if writer is None or _state.pid() != self.pid:
            return False  # (emit drops it too)
        with self._lock:
            try:
                return writer.write_step(t, self.rank, index, loss, backward_calls, time_s, compiles)
            except OSError as exc:
                self._stop_writing(exc)
                return True

    def _stop_writing(self, exc: OSError) -> None:
        """The event log cannot be written: close it, say so once on stderr, emit nothing more. Its
        end record goes into the room kept for it (:class:`~torchrepro.eventlog.event_writer.ReservedEnd`):
        status ``write_failed``, the error's name and the log's file (``ENOSPC rank-0/events.jsonl``),
        the last step recorded; so the run reads as one whose log could not be written (a full disk),
        not as one killed, and never as complete. Without that room the log ends without an end record."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()
            if self.reserved is not None:
                name = errno.errorcode.get(exc.errno or 0, "EIO")
                where = f"{writer.path.parent.name}/{writer.path.name}"
                self.reserved.write(
                    End(
                        rank=self.rank,
                        step=self.steps.completed if self.steps else None,
                        exit_code=None,
                        status="write_failed",
                        error=f"{name} {where}",
                        duration_s=round(time.time() - self._t0, 6),
                    )
                )
                self.reserved.close()
                self.reserved = None
            print(
                f"torchrepro: warning: capture stopped, cannot write {writer.path}: {exc.strerror or exc}",
                file=sys.stderr,
                flush=True,
            )

    def _install_signals(self) -> None:
        """SIGUSR1 dumps every thread's stack to ``stacks.txt`` (a launcher's --timeout asks for it);
        SIGTERM (torchrun stopping the survivors of a failed rank, torchrepro forwarding a stop) and
        SIGHUP write the end event first. Only where the program left these signals at their defaults."""
        if threading.current_thread() is not threading.main_thread():
            return
        if hasattr(signal, "SIGUSR1") and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            self._stacks = open(self.dir / "stacks.txt", "w")
            faulthandler.register(signal.SIGUSR1, file=self._stacks, all_threads=True)
        for sig in _STOP_SIGNALS:
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._stopping:  # the end record being written says how the run ended: the signal follows it
            self._deferred = signum
            return
        name = signal.Signals(signum).name
        self.stop(-signum, f"terminated by {name} (the launcher stopped this rank)", status="terminated")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if self._stacks is not None:
            faulthandler.unregister(signal.SIGUSR1)
            self._stacks.close()
            self._stacks = None
        for sig in _STOP_SIGNALS:
            if signal.getsignal(sig) == self._on_sigterm:
                signal.signal(sig, signal.SIG_DFL)

    def start(self) -> None:
        self.writer = EventWriter(self.dir / EVENTS_FILE)
        self.reserved = ReservedEnd.make(self.dir)
        self.writer.listeners.extend(self.listeners)
        _state.set_session(self)
        self._install_signals()
        env, env_fp = environment()
        from .. import __version__

        self.emit(
            Header(
                torchrepro_version=__version__,
                world_size=self.world_size,
                local_rank=self.local_rank,
                pid=self.pid,
                host=socket.gethostname(),
                argv=list(sys.argv),
                torch_version=torch.__version__,
                python_version=platform.python_version(),
                env=env,
                env_fingerprint=env_fp,
                config={
                    "seed": self.config.seed,
                    "compile_mode": self.config.compile_mode,
                    "steps": asdict(self.config.steps),
                    "rank_from": self.rank_from,
                },
            )
        )
        self._unwatch = watch(lambda probe: self.emit(probe.event()))  # private torch APIs: found or not
        self.steps = StepRecorder(
            self.emit, self.emit_step, self.rank, self.config.steps, snapshot_dir=self.dir / "snapshots"
        )
        self.steps.world(self.world_size)
        self.compiles = CompileCapture(self.emit, lambda: self.steps.completed if self.steps else None, self.rank)
        for capability in [*self.compiles.install(), *self.steps.install()]:
            self.emit(capability)
        if self.config.replay_step is not None:
            from .ops import StepReplay

            steps = self.steps
            replay = StepReplay(
                self.config.replay_step,
                self.config.replay_out or self.dir / "replay.json",
                graphs=self.config.replay_graphs,
                kernels=self.config.replay_kernels,
                unrecorded=lambda: steps.observing > 0,  # capture's own tensor work is not the step's
            )
            self.steps.listeners.append(replay.on_step_end)
            if self.config.replay_step == 0:
                replay.start()
        elif self.config.probe_repeats > 0:
            self._install_prober()
        if self.config.stop_after_step is not None:
            self.steps.listeners.append(self._stop_after)

    def _install_prober(self) -> None:
        """``probe_repeats``: every compiled graph probed after the step it first ran in
        (:mod:`.graph_probe`), wrapped once inductor is imported (never importing it here)."""
        from .graph_probe import GRAPHS_DIR, GraphProber
        from .on_import import when_imported

        prober = self.prober = GraphProber(
            self.emit, self.config.probe_repeats, self.dir / GRAPHS_DIR, self.config.probe_against_eager
        )

        def install() -> None:
            if not prober.install():
                self.note(
                    "graph_probe", False, "this torch lacks inductor's compile_fx: compiled graphs are not probed"
                )

        self._cancel_prober = when_imported("torch._inductor.compile_fx", install)
        assert self.steps is not None
        self.steps.listeners.append(prober.on_step_end)

    def _stop_after(self, index: int) -> None:
        """``stop_after_step``: the script ends cleanly (SystemExit(0)) once that step is recorded."""
        stop = self.config.stop_after_step
        if stop is not None and index >= stop:
            raise SystemExit(0)

    def stop(self, exit_code: int, error: str | None = None, status: str | None = None) -> None:
        """Write the end record and uninstall capture. A SIGTERM or SIGHUP arriving meanwhile (torchrun
        stopping the other ranks as this one fails) waits until the record is written, then ends the
        process as it would have: without the wait it ended the process before its end record."""
        if self.writer is None or self._stopping:
            return
        self._stopping = True
        try:
            self._stop(exit_code, error, status)
        finally:
            self._restore_signals()
            self._stopping = False
        if self._deferred is not None:
            os.kill(os.getpid(), self._deferred)

    def _stop(self, exit_code: int, error: str | None, status: str | None) -> None:
        if self.steps is not None:
            self.steps.flush()
            self.steps.uninstall()
        if self.prober is not None:
            self._cancel_prober()
            if exit_code == 0 and status is None:  # graphs called after the last step (or with no step at all)
                self.prober.on_step_end(-1)
            self.prober.uninstall()
        if self.compiles is not None:
            self.emit(self.compiles.counters())
            self.compiles.uninstall()
        if self._unwatch is not None:
            self._unwatch()
        undo_patches()  # also those made before capture started (compile mode, fix, drift factors)
        status = status or ("ok" if exit_code == 0 else "error")
        self.emit(
            End(
                step=self.steps.completed if self.steps else None,
                exit_code=exit_code,
                status=status,
                error=error,
                duration_s=round(time.time() - self._t0, 6),
            )
        )
        if self.writer is not None:  # (None: the log could not take the end record, kept beside it)
            self.writer.close()
            self.writer = None
        if self.reserved is not None:
            self.reserved.drop()
            self.reserved = None
        _state.set_session(None)

    def joined(self, world: World) -> None:
        """Record the process group this process joined (see :mod:`torchrepro.runtime.follow`)."""
        self.world_size = world.world_size
        if self.steps is not None:
            self.steps.world(world.world_size)
        if world.local_rank is not None:
            self.local_rank = world.local_rank
        self.emit(world)

    def note(self, name: str, available: bool, note: str) -> None:
        self.emit(Capability(name=name, available=available, note=note))
