"""Warm-start packs: a tar of an inductor cache (compiled kernels included) with a manifest.

A pack holds ``torchrepro-pack.json`` first (schema, creation time, the build that wrote it, and
the area, path, size, mtime and sha256 of every file), then ``cache/<path>`` for each cache file
and ``headers/<name>`` for each precompiled C++ header: inductor 2.13 (CPU) checks, and if
missing builds (~150 MB, seconds), these headers in torch's *default* cache directory before it
loads a cached kernel, so a warm start on a new machine needs them too. ``unpack`` never trusts
the archive: it refuses members that are not regular files or whose names are absolute or climb
out (``..``), and sizes it has not been promised: before writing anything it checks the total the
manifest declares against a limit (:data:`MAX_EXPANSION` times the pack's size unless told
otherwise: a small compressed pack that expands to gigabytes is refused) and against the free
disk space, and each member's size against the manifest before writing it, reading no more than
that. It extracts into temporary directories next to the targets, checks every hash against the
manifest, and only then moves the files in, keeping any newer file already there (into a cache
that exists, under its lock: :mod:`.lock`). A failure at any point leaves the targets as they were.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import io
import itertools
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Callable, Iterable, TypedDict

from .. import __version__
from ..errors import InputError, UserError
from ..eventlog.jsoncheck import loads, schema_problem
from ..eventlog.output_guard import check, written
from .lock import cache_lock
from .signing import SIGNATURE, sign, signer, trusted_keys
from ..reports.cache_status import Build
from .layout import PACKED, cache_dir, current_build, existing_cache_dir, headers_dir, looks_like_cache, scan

PACK_SCHEMA = "torchrepro.cache-pack/1"
MANIFEST = "torchrepro-pack.json"
AREAS = ("cache", "headers")  # member name = <area>/<path>
_CHUNK = 1 << 20
_MANIFEST_LIMIT = 256 << 20
MAX_EXPANSION = 20  # default limit on what a pack may unpack to, times its size on disk
MIN_LIMIT = 64 << 20  # ... but never below this
PACK_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def default_limit(pack: Path) -> int:
    """How many bytes a pack may unpack to unless told otherwise."""
    return max(MAX_EXPANSION * pack.stat().st_size, MIN_LIMIT)


def format_size(n: float) -> str:
    """``1.5 GB``: bytes for people (powers of 1000, as ``df -H``)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _why(exc: BaseException) -> str:
    """An exception's message on one line (the CLI prints errors as one line)."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _gzipped(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz"))


def _new_tar(path: Path, gzip: bool) -> tarfile.TarFile:
    # gzip level 1: fast, and the headers are most of the bytes
    return tarfile.open(path, "w:gz", compresslevel=1) if gzip else tarfile.open(path, "w")


class _Hashing:
    """A file object that hashes what is read through it."""

    def __init__(self, fp: IO[bytes]):
        self.fp, self.sha, self.size = fp, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.fp.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data


def _drain(reader: _Hashing, limit: int | None = None, out: IO[bytes] | None = None) -> _Hashing:
    """Read ``reader`` to its end (into ``out``), stopping once past ``limit`` bytes."""
    while data := reader.read(_CHUNK):
        if limit is not None and reader.size > limit:
            break
        if out is not None:
            out.write(data)
    return reader


def sha256_file(path: Path) -> str:
    """The sha256 of a file, read in chunks."""
    with open(path, "rb") as fp:
        return _drain(_Hashing(fp)).sha.hexdigest()


def _tarinfo(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _header_files(directory: Path) -> list[Path]:
    """The precompiled headers (``*.h`` and ``*.h.gch``) in ``directory``: regular files only."""
    if not directory.is_dir():
        return []
    return sorted(
        p for p in directory.iterdir() if p.name.endswith((".h", ".h.gch")) and p.is_file() and not p.is_symlink()
    )


class PackFile(TypedDict):
    """One file of a pack, as its manifest lists it (``area/path`` in the archive)."""

    area: str  # cache | headers
    path: str
    size: int
    mtime: float
    sha256: str


class PackTotals(TypedDict):
    files: int
    bytes: int
    headers: int  # of the files, precompiled headers


class LeftOut(TypedDict):
    unreachable: int
    locks_partial_links: int


class PackManifest(TypedDict):
    """A pack's ``torchrepro-pack.json`` (:func:`parse_manifest` checks ``schema`` and each file)."""

    schema: str
    created: str
    created_by: str
    source: str
    headers_source: str | None
    build: Build
    totals: PackTotals
    left_out: LeftOut
    files: list[PackFile]


def _record(area: str, path: Path, rel: str) -> PackFile:
    try:
        st = path.stat()
        return {"area": area, "path": rel, "size": st.st_size, "mtime": st.st_mtime, "sha256": sha256_file(path)}
    except OSError:
        raise _changed(path) from None


def pack(
    out: str | os.PathLike[str],
    source: str | os.PathLike[str] | None = None,
    *,
    headers: bool = True,
    headers_from: str | os.PathLike[str] | None = None,
    force: bool = False,
    sign_with: str | os.PathLike[str] | None = None,
) -> PackManifest:
    """Write a warm-start pack of an inductor cache directory (default: the one in use) and
    return its manifest. It holds the FX-graph and AOTAutograd entries, the compiled kernels,
    and (unless ``headers=False``) the precompiled C++ headers of ``headers_from`` (default: torch's
    default directory, where inductor keeps them), without which a new machine builds them before
    its first cached kernel loads. Entries no
    current configuration can hit, locks, partial writes and links are left out. ``OUT`` ending
    in ``.tar.gz``/``.tgz`` is gzip-compressed (headers shrink ~6x). An existing ``OUT`` is
    replaced only with ``force``; the write is atomic. With ``sign_with`` (a private key file from
    :func:`~torchrepro.cache.signing.keygen`), the manifest's bytes are signed and the signature
    stored as ``torchrepro-pack.sig`` right after it.

    >>> pack("warm.tar.gz", "/tmp/build-cache")["totals"]  # doctest: +SKIP
    {'files': 33, 'bytes': 312734521}
    """
    root, _ = existing_cache_dir(source)
    if not looks_like_cache(root):
        raise InputError(f"{root} does not look like an inductor cache (no fxgraph/, aotautograd/ or locks/)")
    out = Path(out).absolute()
    if not out.name.endswith(PACK_SUFFIXES):
        raise InputError(f"{out.name}: a pack is written as .tar, .tar.gz or .tgz (not {out.suffix or 'no suffix'})")
    header_root = Path(headers_from).absolute() if headers_from else headers_dir()
    read = [root, header_root] if headers else [root]
    check(out, inputs=read, force=force)  # before the cache is scanned; again when it is written
    entries = scan(root)
    files = [_record("cache", root / e.rel, e.rel) for e in entries if e.category in PACKED and not e.unreachable]
    files += [_record("headers", p, p.name) for p in (_header_files(header_root) if headers else [])]
    manifest: PackManifest = {
        "schema": PACK_SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_by": f"torchrepro {__version__}",
        "source": str(root),
        "headers_source": str(header_root) if headers else None,
        "build": current_build(),
        "totals": {
            "files": len(files),
            "bytes": sum(f["size"] for f in files),
            "headers": sum(f["area"] == "headers" for f in files),
        },
        "left_out": {
            "unreachable": sum(e.unreachable is not None for e in entries),
            "locks_partial_links": sum(e.category not in PACKED for e in entries),
        },
        "files": files,
    }
    data = json.dumps(manifest, indent=1).encode()
    signature = sign(data, sign_with) if sign_with is not None else None
    with written(out, inputs=read, force=force) as tmp, _new_tar(tmp, gzip=_gzipped(out)) as tar:
        tar.addfile(_tarinfo(MANIFEST, len(data), time.time()), io.BytesIO(data))
        if signature is not None:
            tar.addfile(_tarinfo(SIGNATURE, len(signature), time.time()), io.BytesIO(signature))
        for f in files:
            _add_file(tar, root if f["area"] == "cache" else header_root, f)
    return manifest


def _changed(path: Path) -> UserError:
    return UserError(f"{path} changed while packing (a job is compiling into this cache?): pack again when it is idle")


def _add_file(tar: tarfile.TarFile, root: Path, spec: PackFile) -> None:
    """Add one file, checking it still has the bytes the manifest promises."""
    path = root / spec["path"]
    try:
        with open(path, "rb") as fp:
            reader = _Hashing(fp)
            tar.addfile(_tarinfo(f"{spec['area']}/{spec['path']}", spec["size"], spec["mtime"]), reader)
    except OSError as exc:  # gone, or shrank (tarfile: "unexpected end of data"); a full disk is the pack's
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise _changed(path) from None
    if reader.sha.hexdigest() != spec["sha256"]:
        raise _changed(path)


# ---------------------------------------------------------------- reading a pack


def unsafe_name(name: str) -> str | None:
    """Why a path from a pack must not be written anywhere, or None."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return f"{name!r}: absolute path"
    if not name or ".." in PurePosixPath(name).parts or "\\" in name:
        return f"{name!r}: path leaves the pack (.. or backslash)"
    return None


def _member_problem(member: tarfile.TarInfo) -> str | None:
    """Why a member must not be extracted, or None."""
    name = member.name
    if problem := unsafe_name(name):
        return problem
    if member.issparse():
        return f"{name!r}: a sparse file (torchrepro never packs one)"
    if member.issym() or member.islnk():
        return f"{name!r}: {'symbolic' if member.issym() else 'hard'} link to {member.linkname!r}"
    if not member.isfile():
        kind = (
            "device"
            if member.ischr() or member.isblk()
            else "fifo"
            if member.isfifo()
            else "directory"
            if member.isdir()
            else "special file"
        )
        return f"{name!r}: a {kind}, not a regular file"
    return None


def build_mismatches(built: Mapping[str, object], here: Build) -> list[str]:
    """How the build a pack was made with differs from ``here`` in ways that make all of it
    useless (torch, OS, CPU architecture, Triton, Python minor version). ``built``: as a manifest read
    back says it (another torchrepro's may lack keys)."""
    out = []
    for key, label in (("torch", "torch"), ("system", "OS"), ("machine", "CPU architecture"), ("triton", "Triton")):
        if built.get(key) != here.get(key):
            out.append(f"{label} {built.get(key)} (this is {here.get(key)})")
    if _minor(built.get("python")) != _minor(here.get("python")):
        out.append(f"Python {built.get('python')} (this is {here.get('python')})")
    return out


def kernel_mismatches(built: Mapping[str, object], here: Build) -> list[str]:
    """Differences that keep the graphs hitting but rebuild every C++ kernel: inductor hashes the
    compile command (torch and Python include paths, CPU capability flags, compiler) into each
    kernel's key."""
    labels = (
        ("torch_dir", "torch installed at"),
        ("python_include", "Python headers at"),
        ("cpu_capability", "CPU capability"),
        ("compiler", "compiler"),
    )
    return [
        f"{label} {built.get(key)} (this is {here.get(key)})"
        for key, label in labels
        if built.get(key) != here.get(key)
    ]


@dataclass
class PackCheck:
    """What reading a pack found: its manifest, the files checked, and every problem."""

    path: Path
    manifest: PackManifest
    files: int = 0
    bytes: int = 0
    signer: str | None = None  # fingerprint of the key that signed the manifest; None: unsigned
    signed: bool = False  # the pack holds a signature (``signer`` None then: it does not verify)
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
    except tarfile.ReadError:
        raise InputError(f"{path} is not a tar archive, or is damaged") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"cannot read {path}: {_why(exc)}") from None


_MANIFEST_SCHEMA = {  # what reading and unpacking a pack relies on (pack() writes more: kept as written)
    "type": "object",
    "required": ["schema", "files"],
    "properties": {
        "schema": {"const": PACK_SCHEMA},
        "build": {"type": "object"},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["area", "path", "sha256", "size"],
                "properties": {
                    "area": {"enum": list(AREAS)},
                    "path": {"type": "string", "maxLength": 4096},
                    "sha256": {"type": "string", "maxLength": 64},
                    "size": {"type": "integer", "minimum": 0, "maximum": 2**53},
                    "mtime": {"type": "number"},
                },
            },
        },
    },
}


def parse_manifest(data: bytes, where: str) -> PackManifest:
    """A pack manifest from its bytes, checked against its schema and bounds; :class:`InputError`
    names ``where`` and the field otherwise."""
    try:
        manifest: PackManifest = loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: unreadable manifest ({_why(exc)})") from None
    if (problem := schema_problem(manifest, _MANIFEST_SCHEMA)) is not None:
        raise InputError(f"{where}: unreadable manifest ({problem})")
    return manifest


def _minor(version: object) -> str:
    """``"3.11"`` of ``"3.11.7"``."""
    return ".".join(str(version).split(".")[:2])


def _member_file(tar: tarfile.TarFile, member: tarfile.TarInfo) -> IO[bytes]:
    """A regular member's bytes (the members read here were checked to be regular files)."""
    fp = tar.extractfile(member)
    if fp is None:
        raise tarfile.TarError(f"{member.name} is not a regular file")
    return fp


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> bytes:
    try:
        return _member_file(tar, member).read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"{path}: unreadable {member.name} ({_why(exc)})") from None


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo | None, path: Path) -> bytes:
    if member is None or member.name != MANIFEST or not member.isfile() or member.size > _MANIFEST_LIMIT:
        raise InputError(f"{path} is not a torchrepro cache pack (its first member is not {MANIFEST})")
    return _read_member(tar, member, path)


def check_pack(
    path: str | os.PathLike[str],
    extract_to: Callable[[str], Path] | None = None,
    *,
    stop_early: bool = False,
    expect_build: Build | None = None,
    max_bytes: int | None = None,
    authenticate: Callable[[str | None], None] | None = None,
) -> PackCheck:
    """Read a pack member by member, checking names, types, sizes and sha256 against its manifest;
    with ``extract_to``, also write each file to ``extract_to(area) / path``. With
    ``expect_build``, a pack made for another build is a problem found before any file is read; so
    is a manifest declaring more than ``max_bytes`` in all (default :func:`default_limit`) or,
    with ``extract_to``, more than the free disk space there.
    A signature (``torchrepro-pack.sig``, right after the manifest) is checked against the
    manifest's bytes first: ``signer`` is the key's fingerprint, a mismatch a problem found before
    any file is read; ``authenticate(signer)`` then runs, before anything is extracted, and
    refuses by raising.
    :class:`InputError` if it is not a pack at all; everything else is in ``problems``.

    >>> check_pack("warm.tar").ok  # doctest: +SKIP
    True
    """
    path = Path(path)
    with _open_tar(path) as tar:
        members = iter(tar)
        try:
            first = next(members, None)
            data = _read_manifest(tar, first, path)
            result = PackCheck(path, parse_manifest(data, str(path)))
            second = next(members, None)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise InputError(f"{path} is not a tar archive, or is damaged ({_why(exc)})") from None
        if second is not None and second.name == SIGNATURE:
            result.signed = True
            try:
                if not second.isfile() or second.size > _MANIFEST_LIMIT:
                    raise InputError(f"{path}: unreadable {SIGNATURE} (not a small regular member)")
                result.signer = signer(data, _read_member(tar, second, path), str(path))
            except InputError as exc:
                result.problems.append(str(exc).removeprefix(f"{path}: "))
                return result
        elif second is not None:
            members = itertools.chain([second], members)
        if authenticate is not None:
            authenticate(result.signer)
        if expect_build is not None and (diff := build_mismatches(result.manifest.get("build", {}), expect_build)):
            result.problems.append("built for another installation: " + "; ".join(diff))
            return result
        if problem := _size_problem(path, result.manifest["files"], max_bytes, extract_to):
            result.problems.append(problem)
            return result
        expected = {f"{f['area']}/{f['path']}": f for f in result.manifest["files"]}
        seen: set[str] = set()
        try:
            for member in members:
                if stop_early and result.problems:
                    return result
                _check_member(tar, member, expected, seen, result, extract_to)
        except (tarfile.TarError, OSError, EOFError) as exc:
            result.problems.append(f"the archive is damaged or truncated ({_why(exc)})")
            return result
        missing = sorted(set(expected) - seen)
        if missing:
            result.problems.append(
                f"{len(missing)} file(s) in the manifest are missing from the archive, e.g. {missing[0]}"
            )
    return result


def _size_problem(
    path: Path, files: list[PackFile], max_bytes: int | None, extract_to: Callable[[str], Path] | None
) -> str | None:
    """Why the files a manifest declares are too big to unpack (over the limit, or the free space)."""
    if any(f["size"] < 0 for f in files):
        return "the manifest declares a negative file size"
    total = sum(f["size"] for f in files)
    limit = default_limit(path) if max_bytes is None else max_bytes
    if total > limit:
        how = "--max-size" if max_bytes is not None else f"{MAX_EXPANSION}x the pack's size; --max-size to raise it"
        return f"the manifest declares {format_size(total)} of files, over the limit of {format_size(limit)} ({how})"
    if extract_to is None:
        return None
    for area in AREAS:
        needed = sum(f["size"] for f in files if f["area"] == area)
        if needed:
            where = extract_to(area).parent
            free = shutil.disk_usage(where).free
            if needed > free:
                return f"{format_size(needed)} to unpack, but only {format_size(free)} free in {where}"
    return None


def _check_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    expected: dict[str, PackFile],
    seen: set[str],
    result: PackCheck,
    extract_to: Callable[[str], Path] | None,
) -> None:
    name = member.name
    problem = _member_problem(member)
    if problem is None and (name not in expected or name in seen):
        problem = f"{name!r}: {'listed twice' if name in seen else 'not in the manifest'}"
    if problem:
        result.problems.append(problem)
        return
    seen.add(name)
    spec = expected[name]
    if member.size != spec["size"]:
        result.problems.append(
            f"{name}: {format_size(member.size)} in the archive, the manifest says {format_size(spec['size'])}"
        )
        return
    reader = _Hashing(_member_file(tar, member))
    if extract_to is None:
        _drain(reader, spec["size"])
    else:
        target = extract_to(spec["area"]) / spec["path"]
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = open(target, "xb")
        except OSError as exc:
            raise InputError(f"cannot write {target}: {exc.strerror or exc}") from None
        with out:
            _drain(reader, spec["size"], out)
        os.utime(target, (spec.get("mtime", member.mtime),) * 2)
    if reader.size != spec["size"] or reader.sha.hexdigest() != spec["sha256"]:
        result.problems.append(f"{name}: content does not match the manifest's sha256 (damaged or altered)")
        return
    result.files += 1
    result.bytes += reader.size


# ---------------------------------------------------------------- unpack


def _nearest_existing(path: Path) -> Path:
    while not path.exists():
        path = path.parent
    return path


class _Staging:
    """One temporary directory per target, next to it (same filesystem: moves are renames)."""

    def __init__(self, targets: dict[str, Path]):
        self.targets: dict[str, Path] = targets
        self.dirs: dict[str, Path] = {}

    def __call__(self, area: str) -> Path:
        if area not in self.dirs:
            target = self.targets[area]
            if target.exists() and not target.is_dir():
                raise InputError(f"{target} exists and is not a directory")
            try:
                self.dirs[area] = Path(
                    tempfile.mkdtemp(prefix=".torchrepro-unpack-", dir=_nearest_existing(target.parent))
                )
            except OSError as exc:
                raise InputError(f"cannot write next to {target}: {exc.strerror or exc}") from None
        return self.dirs[area] / "new"

    def remove(self) -> None:
        for directory in self.dirs.values():
            shutil.rmtree(directory, ignore_errors=True)


def unpack(
    pack_path: str | os.PathLike[str],
    into: str | os.PathLike[str] | None = None,
    *,
    headers_into: str | os.PathLike[str] | None = None,
    force: bool = False,
    max_bytes: int | None = None,
    trusted: Iterable[str | os.PathLike[str]] | None = None,
    allow_unsigned: bool = False,
) -> Unpacked:
    """Unpack a warm-start pack into an inductor cache directory (default: the one in use), and
    its precompiled headers into ``headers_into`` (default: where this process's inductor reads
    them, ``<torch's default cache dir>/precompiled_headers``).

    A compile cache is code (torch loads its pickles), so the pack must be signed by one of the
    public keys in ``trusted`` (``.pub`` files; default: those ``TORCHREPRO_TRUSTED_KEYS`` lists),
    checked before anything is extracted; an unsigned pack, or one signed by another key, is
    refused unless ``allow_unsigned`` (then ``verified`` is False in the result); a signature that
    does not match the manifest is always refused.
    Every hash is checked before anything is moved in; a pack built for another torch, Python
    minor version, Triton or platform is refused unless ``force``; members that are links,
    devices, absolute or ``..`` paths are refused; a file already there that is as new or newer
    is kept; a pack declaring more than ``max_bytes`` (default :func:`default_limit`) or more than
    the free disk space is refused before anything is written. Any failure raises
    :class:`InputError` and leaves both targets as they were.
    ``kernels_rebuilt`` says why the compiled kernels will not be reused (another torch path,
    Python, CPU capability or compiler) although the graphs still hit.

    >>> unpack("warm.tar", into="/tmp/rank-0-cache")  # doctest: +SKIP
    {'path': '/tmp/rank-0-cache', 'added': 31, 'replaced': 0, 'kept': 2, ...}
    """
    here = current_build()
    keys = trusted_keys(trusted)
    authenticate = functools.partial(_authenticate, Path(pack_path), keys, allow_unsigned)
    targets = {"cache": cache_dir(into)[0], "headers": Path(headers_into).absolute() if headers_into else headers_dir()}
    staging = _Staging(targets)
    try:
        check = check_pack(
            pack_path,
            staging,
            stop_early=True,
            expect_build=None if force else here,
            max_bytes=max_bytes,
            authenticate=authenticate,
        )
        if check.problems:
            hint = " (pass --force to unpack anyway)" if check.problems[0].startswith("built for") else ""
            raise InputError(f"{check.path}: {check.problems[0]}{hint}; nothing was unpacked")
        move = _Move()
        # into a cache that exists, one process at a time (cache.lock; a new one appears whole, by one rename)
        with cache_lock(targets["cache"]) if targets["cache"].is_dir() else contextlib.nullcontext():
            try:
                for area in AREAS:
                    if area in staging.dirs:
                        move.commit(
                            staging.dirs[area], targets[area], [f for f in check.manifest["files"] if f["area"] == area]
                        )
            except OSError as exc:
                move.undo()
                raise InputError(
                    f"could not move the files into {targets['cache']} ({exc.strerror or exc}); nothing was changed"
                ) from None
    finally:
        staging.remove()
    built: Mapping[str, object] = check.manifest.get("build", {})
    return {
        "path": str(targets["cache"]),
        "headers_path": str(targets["headers"]),
        "pack": str(check.path),
        "added": move.counts["added"],
        "replaced": move.counts["replaced"],
        "kept": move.counts["kept"],
        "bytes": check.bytes,
        "signer": check.signer,
        "verified": check.signer in keys,
        "built_with": built,
        "kernels_rebuilt": kernel_mismatches(built, here),
    }


def pack_signer(path: str | os.PathLike[str]) -> str | None:
    """Who signed a pack: the fingerprint of the key whose signature matches its manifest (None:
    unsigned), from the manifest and the signature alone (no file of the pack is read).
    :class:`InputError` for a file that is not a pack, or a signature that does not match.

    >>> pack_signer("warm.tar")  # doctest: +SKIP
    'SHA256:0rQ...'
    """

    class Read(Exception):
        signer: str | None

    def stop(signer: str | None) -> None:  # called once the signature is checked, before any member is read
        found = Read()
        found.signer = signer
        raise found

    try:
        check = check_pack(path, authenticate=stop)
    except Read as read:
        return read.signer
    raise InputError(f"{check.path}: {check.problems[0]}")


def unverified(result: Unpacked) -> str:
    """The one warning for a pack unpacked with ``allow_unsigned`` that no trusted key signed."""
    who = f"signed by {result['signer']}, not a trusted key" if result["signer"] else "unsigned"
    return f"warning: the author of {result['pack']} was not verified ({who}); unpacked because of --allow-unsigned"


def _authenticate(path: Path, keys: dict[str, str], allow_unsigned: bool, signer: str | None) -> None:
    """Refuse a pack no trusted key signed, unless ``allow_unsigned``."""
    if signer in keys or allow_unsigned:
        return
    if signer is None:
        raise InputError(
            f"{path}: the pack is unsigned, and a compile cache is code (torch loads its pickles): unpack only "
            "packs signed by a key you trust, or pass --allow-unsigned; nothing was unpacked"
        )
    given = f"{len(keys)} given" if keys else "none given: --trusted KEY.pub or TORCHREPRO_TRUSTED_KEYS"
    raise InputError(
        f"{path}: signed by {signer}, which is not a trusted key ({given}); pass its .pub with --trusted if you "
        "trust it, or --allow-unsigned; nothing was unpacked"
    )


class Moved(TypedDict):
    added: int
    replaced: int  # an older file
    kept: int  # a file already there, as new or newer


class Unpacked(Moved):
    """What :func:`unpack` did: where the files went, how many were added, replaced or kept, and who
    signed the pack (``verified``: a trusted key); ``kernels_rebuilt``: see :func:`kernel_mismatches`."""

    path: str
    headers_path: str
    pack: str
    bytes: int
    signer: str | None
    verified: bool
    built_with: Mapping[str, object]  # the manifest's ``build``, as the pack says it
    kernels_rebuilt: list[str]


@dataclass
class _Move:
    """Moves verified files into place, remembering enough to put everything back."""

    counts: Moved = field(default_factory=lambda: Moved(added=0, replaced=0, kept=0))
    placed: list[tuple[Path, Path | None]] = field(default_factory=list)  # (file, backup of what it replaced)
    made: list[Path] = field(default_factory=list)  # directories created, outermost first
    renamed: list[tuple[Path, Path]] = field(default_factory=list)  # (new target directory, where it came from)

    def commit(self, staging: Path, target: Path, files: list[PackFile]) -> None:
        new = staging / "new"
        if not target.exists():  # a new target appears whole, by one rename
            self.made.extend(_make_parents(target.parent))
            new.chmod(0o700)
            try:
                os.rename(new, target)
            except OSError:
                if not target.is_dir():
                    raise
                # another process (a rank prewarming the same machine) created it first: merge below
            else:
                self.renamed.append((target, new))
                self.counts["added"] += len(files)
                return
        for f in files:
            dest = target / f["path"]
            backup = None
            if os.path.lexists(dest):
                if (
                    dest.is_symlink()
                    or not dest.is_file()
                    or dest.stat().st_mtime >= f["mtime"]
                    or sha256_file(dest) == f["sha256"]
                ):
                    self.counts["kept"] += 1
                    continue
                backup = staging / "old" / f["path"]
                backup.parent.mkdir(parents=True, exist_ok=True)
                os.replace(dest, backup)
            self.made.extend(_make_parents(dest.parent))
            os.replace(new / f["path"], dest)
            self.placed.append((dest, backup))
            if backup:
                self.counts["replaced"] += 1
            else:
                self.counts["added"] += 1

    def undo(self) -> None:
        for dest, backup in reversed(self.placed):
            if backup is not None:
                os.replace(backup, dest)
            else:
                dest.unlink(missing_ok=True)
        for target, origin in reversed(self.renamed):
            os.rename(target, origin)
        for directory in reversed(self.made):
            try:
                directory.rmdir()
            except OSError:
                pass


def _make_parents(directory: Path) -> list[Path]:
    """Create ``directory`` and missing parents; returns those this call created, outermost first
    (another process may create some of them at the same time)."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    created = []
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        created.append(d)
    return created
