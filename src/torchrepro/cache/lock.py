"""The lock of a compile-cache directory: processes that move unpacked files into one cache
(``cache unpack --into``, :func:`torchrepro.cache.prewarm` in each rank) do it one at a time.

An advisory ``flock`` on ``<cache>/locks/torchrepro-prewarm.lock``, which holds its holder's pid;
the kernel drops it when the holder dies, even by SIGKILL. A process that waits says so after
:data:`SAY_AFTER_S` (one line on stderr: the lock file and the holder's pid when it wrote one), and
gives up after ``TORCHREPRO_LOCK_TIMEOUT`` seconds (default :data:`DEFAULT_TIMEOUT_S`) with an
:class:`~torchrepro.errors.InputError` naming both.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError

LOCK_FILE = Path("locks") / "torchrepro-prewarm.lock"
TIMEOUT_VAR = "TORCHREPRO_LOCK_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
SAY_AFTER_S = 1.0


def lock_timeout() -> float:
    """Seconds a process waits for a cache lock: ``TORCHREPRO_LOCK_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`."""
    value = os.environ.get(TIMEOUT_VAR, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise InputError(f"{TIMEOUT_VAR}={value!r}: not a number of seconds (0 or more)")
    return seconds


def _holder(fd: int) -> str:
    pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return f" (held by pid {pid})" if pid.isdigit() else " (its holder wrote no pid)"


@contextmanager
def cache_lock(directory: Path) -> Iterator[None]:
    """Hold the lock of the cache ``directory`` (created if missing, with its ``locks/``) while
    the block runs; see the module's docstring for the wait."""
    try:
        import fcntl
    except ImportError:  # no flock here: each file is moved in atomically all the same
        yield
        return
    lock = directory / LOCK_FILE
    timeout = lock_timeout()
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise InputError(f"cannot open the cache lock {lock}: {exc.strerror or exc}") from None
    try:
        start, said = time.monotonic(), False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pass
            waited = time.monotonic() - start
            if waited >= timeout:
                raise InputError(
                    f"the cache lock {lock} is still taken after {timeout:g} s{_holder(fd)}: another process is "
                    f"unpacking into {directory} (wait longer with {TIMEOUT_VAR}=SECONDS)"
                )
            if not said and waited >= SAY_AFTER_S:
                said = True
                print(
                    f"torchrepro: waiting for the cache lock {lock}{_holder(fd)}, at most {timeout:g} s "
                    f"({TIMEOUT_VAR})",
                    file=sys.stderr,
                    flush=True,
                )
            time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # (no pid left behind that a later reader could blame)
    finally:
        os.close(fd)
