"""A run's parameter snapshot files (``rank-<r>/snapshots/step-<n>.npz``, ``sketch-<n>.npz``,
written by :mod:`torchrepro.capture.snapshots`), read as any file of a run directory from
elsewhere is: bounded, and checked against what the run recorded.

:func:`read_npz` reads an uncompressed ``.npz`` of plain arrays from a regular file only (no link,
FIFO or device), under :data:`MAX_SNAPSHOT_BYTES`, every array's header (its shape and dtype)
checked against the bytes its member holds before anything is allocated: an array that declares
2^40 elements in a few bytes is refused, never allocated.

:func:`fingerprints` says which fingerprints a parameter whose values a snapshot holds had when the
run recorded it (``Step.param_fps``, a sketch's ``fps``: the first 16 hex digits of
:func:`torchrepro.digests.fingerprint`), computed here with numpy and xxhash alone (reading a run
needs no torch): the CPU digest (xxh3-128 over a header and the tensor's bytes) and the device digest
(two 64-bit position-weighted sums, reduced on the device), for the dtype the run recorded (a
``bfloat16`` snapshot holds its values as float32; a complex one as real pairs). Snapshots whose
values do not match them are damaged or replaced: never evidence.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import zipfile
from tokenize import TokenError
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from ..errors import InputError
from .event_reader import open_regular

if TYPE_CHECKING:
    import numpy as np


def _memory() -> int:
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return 8 << 30


MAX_SNAPSHOT_BYTES = max(1 << 30, _memory() // 4)  # a snapshot file read whole, at most (two are compared at once)
_HEADER_LIMIT = 10000  # an array's .npy header, at most (numpy's own default)
DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")  # numpy = torch name
_GOLDEN, _MIX = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9
_CHUNK = 1 << 22  # words summed at a time (bounds the temporaries)


def read_npz(path: Path, what: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` torchrepro wrote (uncompressed members, no pickles); :class:`InputError`
    naming ``path`` for one that is not a regular file, is over :data:`MAX_SNAPSHOT_BYTES`, or whose
    members declare other sizes than they hold."""
    try:
        with open_regular(path, follow_links=False) as fp:
            size = os.fstat(fp.fileno()).st_size
            if size > MAX_SNAPSHOT_BYTES:
                raise InputError(
                    f"{path}: {size} bytes, over the {MAX_SNAPSHOT_BYTES >> 20} MiB a {what} may take here"
                )
            with zipfile.ZipFile(fp) as archive:
                members = archive.infolist()
                arrays = {}
                for member in members:
                    if not member.filename.endswith(".npy") or member.compress_type != zipfile.ZIP_STORED:
                        raise InputError(
                            f"{path}: member {member.filename[:80]!r} is not an uncompressed array: not a {what}"
                        )
                    if member.file_size > size:
                        raise InputError(f"{path}: declares {member.file_size} bytes in a file of {size}: not a {what}")
                    with archive.open(member) as data:
                        arrays[member.filename[:-4]] = _array(data, member.file_size, path, what)
                return arrays
    except InputError:
        raise
    except (
        OSError,
        ValueError,
        EOFError,
        KeyError,
        zipfile.BadZipFile,
        RecursionError,
        SyntaxError,
        TokenError,
    ) as exc:  # a header numpy cannot parse raises the last two
        raise InputError(f"{path}: unreadable {what} ({' '.join(str(exc).split())[:200]})") from None


def _array(data: Any, held: int, path: Path, what: str) -> np.ndarray:
    """One member's array, its header checked against the ``held`` bytes of the member first."""
    import numpy as np
    from numpy.lib import format as npy

    version = npy.read_magic(data)
    reader = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, fortran, dtype = reader(data, max_header_size=_HEADER_LIMIT)
    if dtype.hasobject:
        raise InputError(f"{path}: an array of Python objects: not a {what}")
    count = math.prod(shape)
    if data.tell() + count * dtype.itemsize != held:
        raise InputError(
            f"{path}: an array declares {count} elements of {dtype.itemsize} bytes, its member holds "
            f"{held - data.tell()}: not a {what}"
        )
    raw = data.read(count * dtype.itemsize)
    array: np.ndarray = np.frombuffer(raw, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    return array


# --- fingerprints --------------------------------------------------------------------------------


def _sized(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _digest(kind: str, dtype: str, shape: tuple[int, ...], payload: Any) -> str:
    """:func:`torchrepro.digests.fingerprint` of a tensor from its leaf digest's parts, 16 hex digits."""
    leaf = xxhash.xxh3_128()
    leaf.update(_sized(f"{kind} torch.{dtype} {tuple(shape)}".encode()))
    leaf.update(payload)
    return xxhash.xxh3_128_hexdigest(b"t" + leaf.digest())[:16]


def _device_sums(raw: np.ndarray) -> bytes:
    """The two sums of the device digest (``torchrepro.digests._device_digest``) of these bytes:
    zero-padded 64-bit words ``w_i``, ``S1 = sum(w_i a_i)``, ``S2 = sum(mix(w_i a_i))`` mod 2^64."""
    import numpy as np

    words = np.concatenate([raw, np.zeros(-raw.size % 8, np.uint8)]).view("<u8")
    s1 = s2 = np.uint64(0)
    with np.errstate(over="ignore"):
        for start in range(0, words.size, _CHUNK):
            w = words[start : start + _CHUNK]
            x = np.arange(start, start + w.size, dtype=np.uint64)
            x *= np.uint64(_GOLDEN)
            x += np.uint64(_MIX)
            x |= np.uint64(1)
            x *= w
            s1 += x.sum(dtype=np.uint64)
            x ^= x >> np.uint64(32)
            x *= np.uint64(_MIX)
            x ^= x >> np.uint64(29)
            s2 += x.sum(dtype=np.uint64)
    return struct.pack("<QQ", int(s1), int(s2))


def _as(array: np.ndarray, dtype: str) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """The bytes and shape a tensor of torch dtype ``dtype`` had, whose values a snapshot holds in
    ``array``; None where they cannot be had back (not that dtype)."""
    import numpy as np

    a = np.require(array, requirements="C")  # (ascontiguousarray would make a 0-d array 1-d)
    if dtype == "bfloat16":  # kept as float32 (a sketch's whole values: float64): its upper 16 bits
        if a.dtype.kind != "f" or not np.array_equal(a.astype(np.float32).astype(a.dtype), a, equal_nan=True):
            return None
        bits = a.astype(np.float32).view(np.uint32)
        if np.any(bits & 0xFFFF):
            return None
        return (bits >> 16).astype("<u2").reshape(-1).view(np.uint8), a.shape
    if dtype in ("complex64", "complex128"):  # kept as real pairs
        real = {"complex64": np.float32, "complex128": np.float64}[dtype]
        if a.dtype != real or not a.ndim or a.shape[-1] != 2:
            return None
        return a.reshape(-1).view(np.uint8), a.shape[:-1]
    if dtype in DTYPES and a.dtype == np.dtype(dtype):
        return a.reshape(-1).view(np.uint8), a.shape
    if dtype in ("float32", "float64", "float16") and a.dtype.kind == "f":  # a sketch's whole values (float64)
        narrow = a.astype(dtype)
        if np.array_equal(narrow.astype(a.dtype), a, equal_nan=True):
            return narrow.reshape(-1).view(np.uint8), a.shape
    return None


def fingerprints(array: np.ndarray, dtypes: list[str]) -> Iterator[str]:
    """The fingerprints (16 hex digits) a parameter of one of ``dtypes`` whose values ``array``
    holds had: for each dtype whose bytes can be had back, its CPU digest, then its device digest
    (computed only when asked for: a generator)."""
    for dtype in dtypes:
        found = _as(array, dtype)
        if found is None:
            continue
        raw, shape = found
        yield _digest("cpu-xxh3", dtype, shape, raw)
        yield _digest("device-sum64x2", dtype, shape, _device_sums(raw))


def candidate_dtypes(array: np.ndarray, recorded: str | None) -> list[str]:
    """The dtypes a parameter whose values ``array`` holds may have had: the one the run recorded
    (and, for a complex one, the real pairs a sketch fingerprints), else the array's own and those
    a snapshot widens (bfloat16 as float32)."""
    if recorded is not None:
        pairs = {"complex64": "float32", "complex128": "float64"}.get(recorded)
        return [recorded, pairs] if pairs else [recorded]
    own = str(array.dtype)
    return [own, "bfloat16", "float16"] if own in ("float32", "float64") else [own]


def matches(array: np.ndarray, recorded: list[str], dtypes: list[str]) -> bool:
    """Whether every fingerprint in ``recorded`` is one a parameter of one of ``dtypes`` holding
    ``array``'s values had."""
    if not recorded:
        return True
    wanted = set(recorded)
    seen: set[str] = set()
    for fp in fingerprints(array, dtypes):
        seen.add(fp)
        if wanted <= seen:
            return True
    return False
