"""Warm-start packs: a tar of an inductor cache (compiled kernels included) with a manifest.

A pack holds ``torchrepro-pack.json`` first (schema, creation time, the torch/Triton/Python
versions and platform that wrote it, and the size, mtime and sha256 of every file), then
``cache/<path>`` for each file. ``unpack`` never trusts the archive: it refuses members that
are not regular files or whose names are absolute or climb out (``..``), extracts into a
temporary directory next to the target, checks every hash against the manifest, and only then
moves the files in, keeping any newer file already there. A failure at any point leaves the
target as it was.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, Iterator

from .. import __version__
from ..errors import InputError, UserError
from .layout import PACKED, cache_dir, current_build, existing_cache_dir, looks_like_cache, scan

PACK_SCHEMA = "torchrepro.cache-pack/1"
MANIFEST = "torchrepro-pack.json"
PREFIX = "cache/"
_CHUNK = 1 << 20
_MANIFEST_LIMIT = 256 << 20


def _compression(path: Path) -> str:
    return "gz" if path.name.endswith((".tar.gz", ".tgz")) else ""


class _Hashing:
    """A file object that hashes what is read through it."""

    def __init__(self, fp: IO[bytes]):
        self.fp, self.sha, self.size = fp, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.fp.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data


def _drain(reader: _Hashing) -> _Hashing:
    while reader.read(_CHUNK):
        pass
    return reader


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    with open(path, "rb") as fp:
        return _drain(_Hashing(fp)).sha.hexdigest()


def _tarinfo(name: str, size: int, mtime: float, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), mode
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


@contextmanager
def _atomic_output(out: Path) -> Iterator[Path]:
    """A temp path next to ``out`` that replaces it only if the block succeeds."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pack(out: str | os.PathLike, source: str | os.PathLike | None = None, *, force: bool = False) -> dict[str, Any]:
    """Write a warm-start pack of an inductor cache directory (default: the one in use) and
    return its manifest. Entries no current configuration can hit, locks, partial writes and
    links are left out. ``OUT`` ending in ``.tar.gz``/``.tgz`` is gzip-compressed. An existing
    ``OUT`` is replaced only with ``force``; the write is atomic.

    >>> pack("warm.tar", "/tmp/build-cache")["totals"]  # doctest: +SKIP
    {'files': 31, 'bytes': 1048576}
    """
    root, _ = existing_cache_dir(source)
    if not looks_like_cache(root):
        raise InputError(f"{root} does not look like an inductor cache (no fxgraph/, aotautograd/ or locks/)")
    out = Path(out).absolute()
    if out.exists() and not force:
        raise UserError(f"{out} already exists: choose another name, or pass --force to replace it")
    if out.is_relative_to(root):
        raise UserError(f"{out} is inside the cache being packed ({root}): write the pack elsewhere")
    if not out.parent.is_dir():
        raise InputError(f"no such directory: {out.parent}")
    entries = scan(root)
    chosen = [e for e in entries if e.category in PACKED and not e.unreachable]
    files = [{"path": e.rel, "size": e.size, "mtime": e.mtime, "sha256": sha256_file(root / e.rel)} for e in chosen]
    manifest = {
        "schema": PACK_SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_by": f"torchrepro {__version__}",
        "source": str(root),
        "build": current_build(),
        "totals": {"files": len(files), "bytes": sum(f["size"] for f in files)},
        "left_out": {"unreachable": sum(e.unreachable is not None for e in entries),
                     "locks_partial_links": sum(e.category not in PACKED for e in entries)},
        "files": files,
    }
    data = json.dumps(manifest, indent=1).encode()
    with _atomic_output(out) as tmp, tarfile.open(tmp, f"w:{_compression(out)}") as tar:
        tar.addfile(_tarinfo(MANIFEST, len(data), time.time()), io.BytesIO(data))
        for f in files:
            _add_file(tar, root, f)
    return manifest


def _add_file(tar: tarfile.TarFile, root: Path, spec: dict[str, Any]) -> None:
    """Add one file, checking it still has the bytes the manifest promises."""
    changed = UserError(f"{root / spec['path']} changed while packing (a job is compiling into this cache?): "
                        "pack again when it is idle")
    try:
        with open(root / spec["path"], "rb") as fp:
            reader = _Hashing(fp)
            tar.addfile(_tarinfo(PREFIX + spec["path"], spec["size"], spec["mtime"]), reader)
    except FileNotFoundError:
        raise changed from None
    except OSError as exc:  # tarfile: "unexpected end of data" when the file shrank
        raise changed from exc
    if reader.sha.hexdigest() != spec["sha256"]:
        raise changed


# ---------------------------------------------------------------- reading a pack


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member must not be extracted, or None."""
    name = member.name
    path = PurePosixPath(name)
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return f"{name!r}: absolute path"
    if ".." in path.parts or "\\" in name or not name:
        return f"{name!r}: path leaves the pack (.. or backslash)"
    if member.issym() or member.islnk():
        return f"{name!r}: {'symbolic' if member.issym() else 'hard'} link to {member.linkname!r}"
    if not member.isfile():
        kind = "device" if member.ischr() or member.isblk() else "fifo" if member.isfifo() else "directory" \
            if member.isdir() else "special file"
        return f"{name!r}: a {kind}, not a regular file"
    return None


def build_mismatches(built: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """How the build a pack was made with differs from ``here`` in ways that make its entries
    useless (torch, platform, Python minor version, Triton)."""
    out = []
    for key, label in (("torch", "torch"), ("system", "OS"), ("machine", "CPU architecture"), ("triton", "Triton")):
        if built.get(key) != here.get(key):
            out.append(f"{label} {built.get(key)} (this is {here.get(key)})")
    minor = lambda v: ".".join(str(v).split(".")[:2])  # noqa: E731
    if minor(built.get("python")) != minor(here.get("python")):
        out.append(f"Python {built.get('python')} (this is {here.get('python')})")
    return out


@dataclass
class PackCheck:
    """What reading a pack found: its manifest, the files checked, and every problem."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    files: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _open_tar(path: Path) -> tarfile.TarFile:
    if not path.exists():
        raise InputError(f"no such pack: {path}")
    if path.is_dir():
        raise InputError(f"{path} is a directory, not a pack")
    try:
        return tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"{path} is not a readable tar archive ({exc})") from None


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo | None, path: Path) -> dict[str, Any]:
    if member is None or member.name != MANIFEST or not member.isfile() or member.size > _MANIFEST_LIMIT:
        raise InputError(f"{path} is not a torchrepro cache pack (its first member is not {MANIFEST})")
    try:
        manifest = json.loads(tar.extractfile(member).read())
        files = manifest["files"]
        if manifest.get("schema") != PACK_SCHEMA or not isinstance(files, list):
            raise ValueError(f"schema {manifest.get('schema')!r}")
        for f in files:
            if not (isinstance(f["path"], str) and isinstance(f["sha256"], str) and isinstance(f["size"], int)):
                raise ValueError("bad file record")
    except (ValueError, KeyError, TypeError, tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"{path}: unreadable manifest ({exc})") from None
    return manifest


def check_pack(path: str | os.PathLike, extract_to: Path | None = None, *, stop_early: bool = False,
               expect_build: dict[str, Any] | None = None) -> PackCheck:
    """Read a pack member by member, checking names, types, sizes and sha256 against its manifest;
    with ``extract_to``, also write each file there (as ``extract_to/<path>``). With
    ``expect_build``, a pack made for another build is a problem found before any file is read.
    :class:`InputError` if it is not a pack at all; everything else is in ``problems``.

    >>> check_pack("warm.tar").ok  # doctest: +SKIP
    True
    """
    path = Path(path)
    result = PackCheck(path)
    with _open_tar(path) as tar:
        members = iter(tar)
        try:
            first = next(members, None)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InputError(f"{path} is not a readable tar archive ({exc})") from None
        result.manifest = _read_manifest(tar, first, path)
        if expect_build is not None and (diff := build_mismatches(result.manifest.get("build", {}), expect_build)):
            result.problems.append("built for another installation: " + "; ".join(diff))
            return result
        expected = {f["path"]: f for f in result.manifest["files"]}
        seen: set[str] = set()
        try:
            for member in members:
                if stop_early and result.problems:
                    return result
                _check_member(tar, member, expected, seen, result, extract_to)
        except (tarfile.TarError, OSError, EOFError) as exc:
            result.problems.append(f"the archive is damaged or truncated ({exc})")
            return result
        missing = sorted(set(expected) - seen)
        if missing:
            result.problems.append(f"{len(missing)} file(s) in the manifest are missing from the archive, "
                                   f"e.g. {missing[0]}")
    return result


def _check_member(tar: tarfile.TarFile, member: tarfile.TarInfo, expected: dict[str, dict], seen: set[str],
                  result: PackCheck, extract_to: Path | None) -> None:
    problem = _member_problem(member)
    rel = member.name[len(PREFIX):] if member.name.startswith(PREFIX) else None
    if problem is None and (rel not in expected or rel in seen):
        problem = f"{member.name!r}: {'listed twice' if rel in seen else 'not in the manifest'}"
    if problem:
        result.problems.append(problem)
        return
    seen.add(rel)
    spec = expected[rel]
    source = tar.extractfile(member)
    reader = _Hashing(source)
    if extract_to is None:
        _drain(reader)
    else:
        target = extract_to / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as out:
            shutil.copyfileobj(reader, out, _CHUNK)
        os.utime(target, (spec.get("mtime", member.mtime),) * 2)
    if reader.size != spec["size"] or reader.sha.hexdigest() != spec["sha256"]:
        result.problems.append(f"{rel}: content does not match the manifest's sha256 (damaged or altered)")
        return
    result.files += 1
    result.bytes += reader.size


# ---------------------------------------------------------------- unpack


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


def unpack(pack_path: str | os.PathLike, into: str | os.PathLike | None = None, *,
           force: bool = False) -> dict[str, Any]:
    """Unpack a warm-start pack into an inductor cache directory (default: the one in use).

    Every hash is checked before anything is moved into the target; a pack built for another
    torch, Python minor version, Triton or platform is refused unless ``force``; members that are
    links, devices, absolute or ``..`` paths are refused; a file already in the target that is
    as new or newer is kept. Any failure raises :class:`InputError` and leaves the target as it was.

    >>> unpack("warm.tar", into="/tmp/rank-0-cache")  # doctest: +SKIP
    {'path': '/tmp/rank-0-cache', 'added': 31, 'replaced': 0, 'kept': 0, ...}
    """
    target, _ = cache_dir(into)
    if target.exists() and not target.is_dir():
        raise InputError(f"{target} exists and is not a directory")
    staging = Path(tempfile.mkdtemp(prefix=".torchrepro-unpack-", dir=_nearest_existing(target.parent)))
    try:
        check = check_pack(pack_path, staging / "new", stop_early=True,
                           expect_build=None if force else current_build())
        if check.problems:
            hint = " (pass --force to unpack anyway)" if check.problems[0].startswith("built for") else ""
            raise InputError(f"{check.path}: {check.problems[0]}{hint}; nothing was unpacked")
        counts = _commit(staging, target, check.manifest["files"])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"path": str(target), "pack": str(check.path), **counts, "bytes": check.bytes,
            "built_with": check.manifest.get("build", {})}


def _commit(staging: Path, target: Path, files: list[dict[str, Any]]) -> dict[str, int]:
    """Move verified files from ``staging/new`` into ``target``; undo everything on failure."""
    new = staging / "new"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        new.mkdir(exist_ok=True)
        new.chmod(0o700)
        os.rename(new, target)
        return {"added": len(files), "replaced": 0, "kept": 0}
    counts = {"added": 0, "replaced": 0, "kept": 0}
    done: list[tuple[Path, Path | None]] = []  # (placed file, backup of what it replaced)
    made: list[Path] = []
    try:
        for f in files:
            dest = target / f["path"]
            backup = None
            if os.path.lexists(dest):
                if dest.is_symlink() or not dest.is_file() or dest.stat().st_mtime >= f["mtime"] \
                        or sha256_file(dest) == f["sha256"]:
                    counts["kept"] += 1
                    continue
                backup = staging / "old" / f["path"]
                backup.parent.mkdir(parents=True, exist_ok=True)
                os.replace(dest, backup)
            made.extend(_make_parents(dest.parent, target))
            os.replace(new / f["path"], dest)
            done.append((dest, backup))
            counts["replaced" if backup else "added"] += 1
    except BaseException:
        for dest, backup in reversed(done):
            if backup is not None:
                os.replace(backup, dest)
            else:
                dest.unlink(missing_ok=True)
        for directory in reversed(made):
            try:
                directory.rmdir()
            except OSError:
                pass
        raise
    return counts


def _make_parents(directory: Path, root: Path) -> list[Path]:
    """Create ``directory`` below ``root``; returns the directories it created, outermost first."""
    missing = []
    while not directory.exists() and directory != root:
        missing.append(directory)
        directory = directory.parent
    for d in reversed(missing):
        d.mkdir()
    return list(reversed(missing))
