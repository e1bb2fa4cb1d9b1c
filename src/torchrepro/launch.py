"""Run a user's script with capture installed: in this process (``torchrepro run``, also what
each rank runs under ``torchrun``), or in a fresh child process whose output is shown live and
kept (``doctor`` and ``check``)."""

from __future__ import annotations

import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .errors import InputError

STDERR_TAIL_LINES = 40


def validate_script(script: str | os.PathLike) -> Path:
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


def run_in_process(script: Path, args: list[str], config) -> int:
    """Run ``script`` as ``__main__`` under a :class:`~torchrepro.capture.session.CaptureSession`;
    returns its exit code. The session's end event records how it ended."""
    from .cache.policy import configure_from_env
    from .capture.fixes import apply_fix
    from .capture.session import CaptureSession

    configure_from_env()  # --cache-policy / --warm-from of the launcher, per rank, before any compile
    _apply_compile_mode(config.compile_mode)
    apply_fix(config.fix)
    if config.seed is not None:
        from .seed import seed_everything

        seed_everything(config.seed)
    session = CaptureSession(config)
    session.start()
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    code, error = 0, None
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
        error = None if code == 0 else f"SystemExit({exc.code!r})"
    except KeyboardInterrupt:
        code, error = 130, "KeyboardInterrupt"
    except BaseException as exc:  # the user's script failed: report it like Python would
        traceback.print_exc()
        code, error = 1, "".join(traceback.format_exception_only(type(exc), exc)).strip()
    finally:
        session.stop(code, error)
    return code


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _apply_compile_mode(mode: str | None) -> None:
    if mode == "eager":
        import torch._dynamo

        torch._dynamo.config.disable = True
    elif mode == "fallback-random":
        import torch._inductor.config

        torch._inductor.config.fallback_random = True


@dataclass
class ChildResult:
    """How a launched run ended: its exit code, the tail of its stderr, and for several ranks each
    rank's exit code (negative: killed by that signal) and stderr tail, and whether it stalled."""

    exit_code: int
    stderr_tail: list[str] = field(default_factory=list)
    rank_exit_codes: dict[int, int] = field(default_factory=dict)
    rank_stderr_tails: dict[int, list[str]] = field(default_factory=dict)
    stalled_after_s: float | None = None


def _pump(source: IO[bytes], sinks: list[IO[bytes]], tail: deque | None) -> None:
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
    """When a rank last wrote an event (the launch time before any did)."""
    times = [p.stat().st_mtime for p in run_dir.glob("rank-*/events.jsonl")]
    return max([since, *times])


def _rank_pids(run_dir: Path) -> list[int]:
    from .events import read_header

    pids = []
    for path in run_dir.glob("rank-*/events.jsonl"):
        header = read_header(path)
        if header is not None and header.pid:
            pids.append(header.pid)
    return pids


def _stop_stalled(proc: subprocess.Popen, run_dir: Path) -> None:
    """Ask every rank for its Python stacks (SIGUSR1 → faulthandler), then end the job."""
    for pid in _rank_pids(run_dir):
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(2.0)
    _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(cmd: list[str], log_dir: Path, *, env: dict[str, str] | None = None, quiet: bool = False,
              stall_timeout: float | None = None, run_dir: Path | None = None) -> ChildResult:
    """Run ``cmd`` in its own process group, showing its output live (unless ``quiet``) and keeping
    it in ``log_dir/stdout.log`` and ``stderr.log``. With ``stall_timeout``, a job whose ranks
    write no event into ``run_dir`` for that many seconds has its stacks dumped and is ended."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tail: deque = deque(maxlen=STDERR_TAIL_LINES)
    stalled = None
    with open(log_dir / "stdout.log", "wb") as out_log, open(log_dir / "stderr.log", "wb") as err_log:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        out_sinks = [out_log] if quiet else [out_log, sys.stdout.buffer]
        err_sinks = [err_log] if quiet else [err_log, sys.stderr.buffer]
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out_sinks, None), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err_sinks, tail), daemon=True)]
        for pump in pumps:
            pump.start()
        try:
            while True:
                try:
                    code = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if stall_timeout is None or run_dir is None:
                        continue
                    quiet_for = time.time() - _last_progress(run_dir, started)
                    if quiet_for > stall_timeout:
                        stalled = round(quiet_for, 1)
                        _stop_stalled(proc, run_dir)
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
        for pump in pumps:
            pump.join(timeout=10)
    return ChildResult(code, list(tail), stalled_after_s=stalled)


_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.DOTALL)


def torchrun_failures(stderr: str) -> dict[int, int]:
    """Each failed rank's exit code from torchrun's failure summary (negative: signal)."""
    return {int(rank): int(code) for rank, code in _FAILURE.findall(stderr)}


def launch(run_dir: Path, script: Path, args: list[str], *, nproc: int = 1, env: dict[str, str] | None = None,
           quiet: bool = False, stall_timeout: float | None = None, **options: Any) -> ChildResult:
    """Run ``script`` under capture in fresh processes: one, or ``nproc`` ranks through torchrun
    (standalone rendezvous, gloo/NCCL as the script chooses). ``options`` are ``torchrepro run`` flags."""
    run_cmd = run_command(run_dir, script, args, **options)
    if nproc > 1:
        logs = run_dir / "torchrun"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "--log-dir", str(logs), "--tee", "3", *run_cmd[1:]]
    else:
        cmd = run_cmd
    result = run_child(cmd, run_dir / "logs", env=env, quiet=quiet, stall_timeout=stall_timeout, run_dir=run_dir)
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


def run_command(run_dir: Path, script: Path, args: list[str], **options: Any) -> list[str]:
    """The ``python -m torchrepro run ...`` command line for a child process; ``options`` are
    that command's flags (``seed=0`` → ``--seed 0``, ``grads=True`` → ``--grads``)."""
    cmd = [sys.executable, "-m", "torchrepro", "run", "--out", str(run_dir)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            cmd.append(flag)
        elif value is not None and value is not False:
            cmd += [flag, str(value)]
    return [*cmd, "--", str(script), *args]


def child_env(seed: int | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child run: ours, plus ``PYTHONHASHSEED`` when seeding."""
    env = dict(os.environ)
    if seed is not None:
        env["PYTHONHASHSEED"] = str(seed % 2**32)
    env.update(extra or {})
    return env
