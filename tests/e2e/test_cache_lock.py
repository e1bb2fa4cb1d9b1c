"""The lock of a compile-cache directory (torchrepro.cache.lock): `cache unpack --into` and
`cache.prewarm` take the same one; a process that waits on it says which lock and whose, and gives
up after TORCHREPRO_LOCK_TIMEOUT seconds (real processes, a real flock)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchrepro.cache.lock import LOCK_FILE, TIMEOUT_VAR

from test_cache import fake_cache
from test_cache_signing import _pack

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="needs flock (POSIX)")

HOLD = """
import sys
from pathlib import Path
from torchrepro.cache.lock import cache_lock
with cache_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
"""


def _holder(cache: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(cache)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def _release(holder: subprocess.Popen) -> None:
    holder.stdin.close()
    assert holder.wait(timeout=60) == 0
    holder.stdout.close()


def _unpack(tmp_path: Path, pack: Path, cache: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torchrepro", "cache", "unpack", str(pack), "--into", str(cache), "--allow-unsigned"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


@pytest.mark.slow  # moved out of `make test` for its time; `make test-slow` runs it
def test_unpack_says_what_it_waits_for_and_gives_up_after_the_timeout(tmp_path, capsys):
    pack = _pack(tmp_path, capsys, "warm.tar")
    cache = fake_cache(tmp_path / "cache")
    holder = _holder(cache)
    try:
        waiting = _unpack(tmp_path, pack, cache, **{TIMEOUT_VAR: "3"})
        out, err = waiting.communicate(timeout=120)
    finally:
        _release(holder)
    lock = cache / LOCK_FILE
    assert waiting.returncode == 2, err
    assert err.splitlines() == [
        f"torchrepro: waiting for the cache lock {lock} (held by pid {holder.pid}), at most 3 s ({TIMEOUT_VAR})",
        f"torchrepro: error: the cache lock {lock} is still taken after 3 s (held by pid {holder.pid}): another "
        f"process is unpacking into {cache} (wait longer with {TIMEOUT_VAR}=SECONDS)",
    ]


def test_unpack_goes_on_once_the_lock_is_free(tmp_path, capsys):
    pack = _pack(tmp_path, capsys, "warm.tar")
    cache = fake_cache(tmp_path / "cache")
    holder = _holder(cache)
    waiting = _unpack(tmp_path, pack, cache)
    try:
        said = waiting.stderr.readline()
    finally:
        _release(holder)
    out, err = waiting.communicate(timeout=120)
    assert said.startswith(f"torchrepro: waiting for the cache lock {cache / LOCK_FILE} (held by pid {holder.pid})")
    assert waiting.returncode == 0, err
    assert "kept" in out


@pytest.mark.slow  # moved out of `make test` for its time (TORCHREPRO_TEST_CPU_LOG); `make test-slow` runs it
def test_prewarm_takes_the_same_lock_and_starts_cold_after_the_timeout(tmp_path, capsys, run_python):
    pack = _pack(tmp_path, capsys, "warm.tar")
    root = tmp_path / "root"
    code = f"""
import warnings
from torchrepro.cache.policy import prewarm
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    plan = prewarm({str(pack)!r}, "shared", {str(root)!r}, allow_unsigned=True)
print(plan.inductor_dir)
print(" | ".join(str(w.message) for w in said))
"""
    cold = {TIMEOUT_VAR: "2"}
    cold.update({name: str(tmp_path / "default") for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")})
    first = run_python(code, env=cold).stdout.splitlines()  # no lock taken yet: the cache is made whole
    cache = Path(first[0])
    assert (cache / "ab" / "cabc.so").is_file(), first
    holder = _holder(cache)
    try:
        done = run_python(code, env=cold)
    finally:
        _release(holder)
    assert f"waiting for the cache lock {cache / LOCK_FILE} (held by pid {holder.pid})" in done.stderr
    assert "warm start skipped, compiling cold: the cache lock" in done.stdout.splitlines()[1]
