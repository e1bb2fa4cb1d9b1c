"""`cache unpack` against packs that promise little and expand to a lot: a sparse member declaring
16 GiB, a member larger than the manifest says, a gzip bomb, a pack bigger than the free disk. Each
is refused before anything is written: the unpack runs with a 1 MiB file-size limit
(RLIMIT_FSIZE), so a write past it fails ("File too large", EFBIG) and the error would say so."""

from __future__ import annotations

import hashlib
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from test_cache import _members, cli, fake_cache, snapshot

GIB = 1 << 30


class _Zeros(io.RawIOBase):
    """``size`` zero bytes, read in chunks (never held in memory)."""

    def __init__(self, size: int):
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def _manifest(tmp_path: Path, capsys, files: list[dict]) -> dict:
    """A real pack's manifest (this build), listing ``files`` instead."""
    good = tmp_path / "good.tar"
    assert cli(capsys, "cache", "pack", good, "--no-headers", "--from", fake_cache(tmp_path / "source"))[0] == 0
    manifest, _ = _members(good)
    manifest["files"] = files
    return manifest


def _zero_pack(path: Path, manifest: dict, member_size: int) -> None:
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("torchrepro-pack.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("cache/ab/cabc.so")
        info.size = member_size
        tar.addfile(info, io.BufferedReader(_Zeros(member_size)))


def _unpack_limited(tmp_path: Path, pack: Path, *options: str) -> subprocess.CompletedProcess:
    """``cache unpack`` in a process that may not write any file past 1 MiB."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torchrepro",
            "cache",
            "unpack",
            str(pack),
            "--into",
            str(tmp_path / "target" / "cache"),
            "--allow-unsigned",  # these packs are about sizes, not authors
            *options,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=limit,
        timeout=300,
    )


def _refused(proc: subprocess.CompletedProcess, tmp_path: Path, words: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchrepro: error:") and words in lines[0], proc.stderr
    assert "File too large" not in proc.stderr
    assert snapshot(tmp_path / "target") == {}  # no staging directory, no file left


@pytest.fixture
def target(tmp_path):
    (tmp_path / "target").mkdir()
    return tmp_path / "target"


@pytest.mark.parametrize("max_size", [None, "100G"])
def test_sparse_member_declaring_16_gib(tmp_path, capsys, target, max_size):
    """By default the declared total is over the limit; allowed that much, the sparse member is refused."""
    build = tmp_path / "build"
    (build / "cache" / "ab").mkdir(parents=True)
    with open(build / "cache" / "ab" / "cabc.so", "wb") as fp:
        fp.truncate(16 * GIB)  # a hole: no disk used
    manifest = _manifest(
        tmp_path, capsys, [{"area": "cache", "path": "ab/cabc.so", "size": 16 * GIB, "mtime": 0, "sha256": "0" * 64}]
    )
    (build / "torchrepro-pack.json").write_text(json.dumps(manifest))
    pack = tmp_path / "sparse.tar"
    subprocess.run(
        ["tar", "-cSf", str(pack), "-C", str(build), "torchrepro-pack.json", "cache/ab/cabc.so"],
        check=True,
        timeout=120,
    )
    assert pack.stat().st_size < 1 << 20
    proc = _unpack_limited(tmp_path, pack, *(["--max-size", max_size] if max_size else []))
    _refused(proc, tmp_path, "over the limit" if max_size is None else "sparse")


def test_member_larger_than_the_manifest_says(tmp_path, capsys, target):
    manifest = _manifest(
        tmp_path,
        capsys,
        [
            {
                "area": "cache",
                "path": "ab/cabc.so",
                "size": 5,
                "mtime": 0,
                "sha256": hashlib.sha256(b"tiny!").hexdigest(),
            }
        ],
    )
    pack = tmp_path / "liar.tar.gz"
    _zero_pack(pack, manifest, 64 << 20)
    _refused(_unpack_limited(tmp_path, pack), tmp_path, "the manifest says 5 B")


def test_gzip_bomb_is_refused_unless_allowed(tmp_path, capsys, target):
    size = 200 << 20
    sha = hashlib.sha256()
    zeros = bytes(1 << 20)
    for _ in range(size >> 20):
        sha.update(zeros)
    manifest = _manifest(
        tmp_path, capsys, [{"area": "cache", "path": "ab/cabc.so", "size": size, "mtime": 0, "sha256": sha.hexdigest()}]
    )
    pack = tmp_path / "bomb.tar.gz"
    _zero_pack(pack, manifest, size)
    assert pack.stat().st_size < size // 100
    _refused(_unpack_limited(tmp_path, pack), tmp_path, "--max-size to raise it")
    code, out, err = cli(
        capsys, "cache", "unpack", pack, "--into", target / "cache", "--max-size", "1G", "--allow-unsigned"
    )
    assert code == 0, err
    assert (target / "cache" / "ab" / "cabc.so").stat().st_size == size


def test_pack_bigger_than_the_free_disk(tmp_path, capsys, target):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    manifest = _manifest(
        tmp_path, capsys, [{"area": "cache", "path": "ab/cabc.so", "size": free * 2, "mtime": 0, "sha256": "0" * 64}]
    )
    pack = tmp_path / "huge.tar.gz"
    _zero_pack(pack, manifest, 1)
    _refused(_unpack_limited(tmp_path, pack, "--max-size", str(free * 4)), tmp_path, "free in")
