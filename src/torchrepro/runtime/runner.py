"""Run a user's script with capture installed, in this process: what ``torchrepro run`` does (each
rank under ``torchrun``, and the child process ``doctor``, ``check`` and ``drift`` start). The
supervisor's side, which starts and ends such processes, is :mod:`torchrepro.commands.launcher`."""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from .run_options import RunOptions
from ..telemetry.otlp import live_listeners

PR_SET_PDEATHSIG = 1


def libc_prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), resolved in this process; None elsewhere. A process that forks
    resolves it first: a forked child must not load libraries (another thread may hold the loader's lock)."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    return None


def die_with_parent(parent: int | None = None, prctl: Callable[..., int] | None = None) -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (Linux
    ``PR_SET_PDEATHSIG``): a torchrepro killed with SIGKILL (the OOM killer, ``kill -9``) leaves no
    job training on alone. If the parent (``parent``: its pid; None: any parent but init) ended
    before this was set up, this process ends here. Nothing happens where ``prctl`` is missing."""
    prctl = prctl or libc_prctl()
    if prctl is None:
        return
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    orphaned = os.getppid() == 1 if parent is None else os.getppid() != parent
    if orphaned:
        os._exit(128 + signal.SIGKILL)


def run_in_process(script: Path, args: list[str], options: RunOptions) -> int:
    """Run ``script`` as ``__main__`` under a :class:`~torchrepro.capture.session.CaptureSession`
    set up as ``options`` say (``options.run_dir`` is set; ``options.module``: that module, as
    ``python -m`` runs it, ``script`` being its file); returns its exit code. The session's end
    event records how it ended."""
    from ..capture.session import CaptureSession
    from .follow import propagate
    from .prepare import prepare

    prepare(options)
    session = CaptureSession(options.capture_config(), listeners=live_listeners())
    session.start()
    propagate(options)  # every process the script starts that becomes a rank captures itself
    sys.argv = [str(script.resolve() if options.module else script), *args]
    sys.path.insert(0, os.getcwd() if options.module else str(script.resolve().parent))  # as python does
    code, error = 0, None
    try:
        if options.module:  # as python -m: its package imported from the working directory, __spec__ set
            runpy.run_module(options.module, run_name="__main__", alter_sys=True)
        else:
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
