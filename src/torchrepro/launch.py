"""Run a user's script with capture installed: in this process (``torchrepro run``, also what
each rank runs under ``torchrun``), or in a fresh child process whose output is shown live and
kept (``doctor`` and ``check``)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import threading
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
    from .capture.session import CaptureSession

    _apply_compile_mode(config.compile_mode)
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
    """How a child run ended, and the tail of what it printed to stderr."""

    exit_code: int
    stderr_tail: list[str] = field(default_factory=list)


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


def run_child(cmd: list[str], log_dir: Path, *, env: dict[str, str] | None = None, quiet: bool = False,
              timeout: float | None = None) -> ChildResult:
    """Run ``cmd``, showing its output live (unless ``quiet``) and keeping it in
    ``log_dir/stdout.log`` and ``stderr.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    tail: deque = deque(maxlen=STDERR_TAIL_LINES)
    with open(log_dir / "stdout.log", "wb") as out_log, open(log_dir / "stderr.log", "wb") as err_log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        out_sinks = [out_log] if quiet else [out_log, sys.stdout.buffer]
        err_sinks = [err_log] if quiet else [err_log, sys.stderr.buffer]
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, out_sinks, None), daemon=True),
                 threading.Thread(target=_pump, args=(proc.stderr, err_sinks, tail), daemon=True)]
        for pump in pumps:
            pump.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
        for pump in pumps:
            pump.join()
    return ChildResult(code, list(tail))


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
