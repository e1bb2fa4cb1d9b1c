"""Bitwise fingerprints of tensors, modules, optimizers and nested data.

Every digest is xxh3-128, written as 32 lowercase hex characters. It is computed
over a canonical, type-tagged byte encoding in which each value is one tag byte
followed by a self-delimiting payload (lengths and counts are little-endian
uint64), so two different structures never share an encoding:

    None  N                      float    f + IEEE-754 binary64 bits
    bool  b + 0x00 | 0x01        complex  c + two binary64
    int   i + len + two's complement, little-endian
    str   s + len + UTF-8        bytes    y + len + bytes
    list  l + count + items      tuple    u + count + items
    set   S + count + sorted items          frozenset  Z + count + sorted items
    dict  d + count + key/value pairs sorted by the key's encoding (any Mapping)
    namedtuple, dataclass   n | D + qualified type name + dict of fields
    Enum  e + qualified type name + member name
    torch.dtype, torch.device   x + type name + str()
    Tensor  t + 16-byte leaf digest         numpy array or scalar  a + leaf digest
    nn.Module  M + dict {"parameters": ..., "buffers": ...} by name
    Optimizer  O + its state_dict()

A tensor's leaf digest is xxh3-128 of a header, u64 length + e.g.
``cpu-xxh3 torch.float32 (2, 3)`` (algorithm, dtype, shape), followed by its
logical bytes in row-major order, so dtype, shape and every bit count: +0.0 and
-0.0 differ, NaNs compare by payload. numpy arrays are hashed the same way, with
``numpy`` and the dtype's ``descr`` in the header. CPU tensors are hashed in place, with
no copy when contiguous. Tensors on other devices are reduced on the device to
two 64-bit position-weighted sums (see `_device_digest`), and only those travel
to the host; their digests therefore differ from a CPU digest of the same bytes,
so compare fingerprints taken on the same kind of device. A tensor on the ``meta`` device holds
no values: its digest is that of the header ``meta <dtype> <shape>`` alone. A DTensor (FSDP2's
sharded parameters) is hashed by this rank's part of it, as that part's own digest.
Python's `hash()` is never used: digests are equal across processes, runs and
machines of the same endianness.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import struct
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash
from torch import nn

from ._compat import compiled_original

if TYPE_CHECKING:
    from collections.abc import Iterable

    from typing import TypeAlias

    from _typeshed import ReadableBuffer

    # numpy declares an array's buffer protocol (`__buffer__`) only for Python >= 3.12
    Buffer: TypeAlias = ReadableBuffer | np.ndarray[Any, Any]

__all__ = ["DeviceDigest", "fingerprint", "fingerprint_later", "fingerprints", "hash_bytes", "stable_uid"]


def hash_bytes(*buffers: Buffer) -> str:
    """xxh3-128 of the concatenated buffers, as 32 hex characters.

    Example: ``hash_bytes(b"ab", b"c") == hash_bytes(b"abc")``.
    """
    return _xxh3(*buffers).hex()


def fingerprint(x: Any) -> str:
    """Digest of the exact state of a tensor, module, optimizer or nested batch.

    Equal digests mean bit-identical content, dtypes and shapes. A module is
    hashed by its parameters and all its buffers (persistent or not) by name,
    unwrapping ``torch.compile``; an optimizer by its ``state_dict()``. Anything
    `stable_uid` accepts gives the same digest here. Nothing is modified, no
    random number is drawn and no autograd graph is recorded.

    Example: ``fingerprint(model) != fingerprint(model_after_one_step)``.
    """
    return xxhash.xxh3_128_hexdigest(_enc(x, stateful=True))


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceDigest:
    """A tensor fingerprint whose two device sums (`_device_digest`) have not reached the host
    yet: ``finish`` turns them, once read, into what :func:`fingerprint` returns."""

    sums: torch.Tensor  # int64[2], on the tensor's device
    header: bytes

    def finish(self, s1: int, s2: int) -> str:
        """The fingerprint, from the two sums as read back (signed int64)."""
        leaf = _xxh3(self.header, struct.pack("<qq", s1, s2))
        return xxhash.xxh3_128_hexdigest(b"t" + leaf)


def fingerprint_later(t: torch.Tensor) -> str | DeviceDigest:
    """:func:`fingerprint` of a tensor without a device synchronisation: on the CPU the digest
    itself; elsewhere a :class:`DeviceDigest` whose sums are read back when convenient."""
    if t.layout != torch.strided or t.device.type in ("cpu", "meta"):
        return fingerprint(t)
    t = _dense(t)
    return DeviceDigest(_device_sums(t), _header("device-sum64x2", t.dtype, t.shape))


def stable_uid(obj: Any) -> str:
    """Canonical id of plain data, the same in every process.

    Dicts in any key order and sets in any iteration order give one id; the
    type is part of it, so ``1``, ``1.0`` and ``True`` differ, as do ``["a", "b"]``
    and ``["ab"]``. Tensors and numpy arrays count by content, as in
    `fingerprint`. Modules, optimizers and unknown types raise ``TypeError``.

    Example: ``stable_uid({"lr": 0.1, "seed": 0}) == stable_uid({"seed": 0, "lr": 0.1})``.
    """
    return xxhash.xxh3_128_hexdigest(_enc(obj, stateful=False))


def fingerprints(x: nn.Module | torch.optim.Optimizer | Mapping[str, Any]) -> dict[str, str]:
    """Fingerprint of each leaf, by dotted name, in traversal order.

    For a module the leaves are its parameters then its buffers, named as in
    ``named_parameters()``; for an optimizer or a (nested) mapping, the values
    reached through dicts, lists and tuples. Comparing two such dicts names the
    first tensor that differs.

    Example: ``fingerprints(model)["fc.weight"] == fingerprint(model.fc.weight)``.
    """
    if isinstance(x, nn.Module):
        m = compiled_original(x)  # one fingerprint for a model and torch.compile(model)
        x = dict([*m.named_parameters(), *m.named_buffers()])
    elif isinstance(x, torch.optim.Optimizer):
        x = x.state_dict()
    return {name: xxhash.xxh3_128_hexdigest(_enc(v, stateful=True)) for name, v in _leaves("", x)}


def _leaves(prefix: str, x: Any) -> Iterator[tuple[str, Any]]:
    items: Iterable[tuple[Any, Any]]
    if isinstance(x, Mapping):
        items = x.items()
    elif type(x) in (list, tuple):
        items = enumerate(x)
    else:
        yield prefix, x
        return
    for k, v in items:
        yield from _leaves(f"{prefix}.{k}" if prefix else str(k), v)


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _qualname(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def _enc(x: Any, stateful: bool) -> bytes:
    """The canonical encoding described in the module docstring (common types first)."""
    if isinstance(x, torch.Tensor):
        return b"t" + _tensor_digest(x)
    if type(x) is list:  # a batch: exactly a list, so none of the types tested before lists below
        return b"l" + _u64(len(x)) + b"".join([_enc(v, stateful) for v in x])
    if x is None:
        return b"N"
    if isinstance(x, bool):
        return b"b" + bytes([x])
    if isinstance(x, enum.Enum):  # before int and str: IntEnum, StrEnum
        return b"e" + _enc(_qualname(x), stateful) + _enc(x.name, stateful)
    if isinstance(x, (np.ndarray, np.generic)):  # before float: np.float64
        return b"a" + _array_digest(np.asarray(x))
    if isinstance(x, str):
        return b"s" + _sized(x.encode("utf-8", "surrogatepass"))
    if isinstance(x, int):
        return b"i" + _sized(x.to_bytes(x.bit_length() // 8 + 1, "little", signed=True))
    if isinstance(x, float):
        return b"f" + struct.pack("<d", x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return b"n" + _enc(_qualname(x), stateful) + _enc(x._asdict(), stateful)  # type: ignore[attr-defined]  # a namedtuple
    if isinstance(x, (list, tuple)):
        tag = b"l" if isinstance(x, list) else b"u"
        return tag + _u64(len(x)) + b"".join([_enc(v, stateful) for v in x])
    if isinstance(x, Mapping):
        pairs = sorted((_enc(k, stateful), _enc(v, stateful)) for k, v in x.items())
        return b"d" + _u64(len(pairs)) + b"".join(k + v for k, v in pairs)
    if isinstance(x, (set, frozenset)):
        tag = b"Z" if isinstance(x, frozenset) else b"S"
        return tag + _u64(len(x)) + b"".join(sorted(_enc(v, stateful) for v in x))
    if isinstance(x, (bytes, bytearray, memoryview)):
        return b"y" + _sized(bytes(x))
    if isinstance(x, complex):
        return b"c" + struct.pack("<dd", x.real, x.imag)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
        return b"D" + _enc(_qualname(x), stateful) + _enc(fields, stateful)
    if isinstance(x, (torch.dtype, torch.device)):
        return b"x" + _enc(_qualname(x), stateful) + _enc(str(x), stateful)
    if stateful and isinstance(x, nn.Module):
        m = compiled_original(x)
        named = {"parameters": dict(m.named_parameters()), "buffers": dict(m.named_buffers())}
        return b"M" + _enc(named, stateful)
    if stateful and isinstance(x, torch.optim.Optimizer):
        return b"O" + _enc(x.state_dict(), stateful)
    raise TypeError(f"cannot {'fingerprint' if stateful else 'make a stable uid of'} {_qualname(x)}")


def _sized(b: bytes) -> bytes:
    return _u64(len(b)) + b


def _tensor_digest(t: torch.Tensor) -> bytes:
    # A batch, a parameter: its memory is its row-major bytes, hashed in place (through ctypes:
    # inside a training step, where caches are cold, faster than numpy(); each call on the tensor
    # costs there a µs or two, so none twice, and the conjugate bit only where it can be set).
    if type(t) in _PLAIN and t.layout is _STRIDED and t.is_cpu and not t.is_nested:
        dtype = t.dtype
        if dtype in _RAW_DTYPES and t.is_contiguous() and not t.is_neg() and not (dtype.is_complex and t.is_conj()):
            size = t.nbytes
            if size:
                return _xxh3(_header("cpu-xxh3", dtype, t.shape), (ctypes.c_char * size).from_address(t.data_ptr()))
    if type(t) not in _PLAIN and hasattr(t, "to_local"):  # a DTensor (FSDP2's parameters): this rank's part
        return _tensor_digest(t.to_local())
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise TypeError(f"cannot fingerprint a {kind} tensor on {t.device}")
    if t.device.type == "meta":  # no values (a model built on meta before to_empty): its dtype and shape
        return _xxh3(_header("meta", t.dtype, t.shape))
    if t.device.type != "cpu":
        return _device_digest(t)
    t = _dense(t)
    return _xxh3(_header("cpu-xxh3", t.dtype, t.shape), _bytes(t).numpy())


_STRIDED = torch.strided
_PLAIN = (torch.Tensor, nn.Parameter)  # not subclasses (DTensor, fake tensors): those take the general path
_RAW_DTYPES = frozenset(  # whose bytes are their values (not quantized: scale and zero point live elsewhere)
    (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
    + (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)
)


def _array_digest(a: np.ndarray) -> bytes:
    if a.dtype.hasobject:
        raise TypeError(f"cannot fingerprint a numpy array of dtype {a.dtype}")
    return _xxh3(_header("numpy", a.dtype.descr, a.shape), np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def _header(kind: str, dtype: Any, shape: tuple[int, ...]) -> bytes:
    """Length-prefixed ``"<kind> <dtype> <shape tuple>"``, e.g. ``cpu-xxh3 torch.float32 (2, 3)``
    (remembered: a training step hashes tensors of the same few shapes again and again)."""
    key = (kind, dtype, shape)
    try:
        return _HEADERS[key]
    except KeyError:
        pass
    except TypeError:  # an unhashable numpy descr (structured dtypes): not remembered
        return _sized(f"{kind} {dtype} {tuple(shape)}".encode())
    if len(_HEADERS) > 4096:
        _HEADERS.clear()
    header = _HEADERS[key] = _sized(f"{kind} {dtype} {tuple(shape)}".encode())
    return header


_HEADERS: dict[tuple[Any, ...], bytes] = {}


def _xxh3(*buffers: Buffer) -> bytes:
    """xxh3-128 of the concatenated buffers, as 16 bytes (big-endian, like its hex)."""
    h = xxhash.xxh3_128()
    for b in buffers:
        h.update(b)  # type: ignore[arg-type]  # an array is a buffer (see Buffer)
    return h.digest()


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` detached, with its logical values laid out contiguously (copied only if needed; the
    checks first, as each call through the dispatcher costs a step's capture a few µs)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 view (no copy)."""
    return t.reshape(-1).view(torch.uint8)


def _i64(u: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return u - (1 << 64) if u >= 1 << 63 else u


_GOLDEN, _MIX = _i64(0x9E3779B97F4A7C15), _i64(0xBF58476D1CE4E5B9)
_LOW32, _LOW35 = (1 << 32) - 1, (1 << 35) - 1


def _device_digest(t: torch.Tensor, chunk_words: int = 1 << 23) -> bytes:
    """Leaf digest computed where the tensor lives; only 16 bytes reach the host.

    The bytes, zero-padded to whole 64-bit words w_i, are reduced with
    wrap-around int64 arithmetic (mod 2^64) to two sums: S1 = sum(w_i * a_i) and
    S2 = sum(mix(w_i * a_i)), where a_i = (i * GOLDEN + MIX) | 1 is odd and mix is
    an invertible xorshift-multiply. Changing any one word (hence any bit)
    changes both sums, since multiplying by an odd number is invertible mod 2^64;
    S2 breaks the linearity of S1 for multi-word changes. Integer sums do not
    depend on reduction order, so the result is deterministic. Work proceeds in
    chunks of `chunk_words` words, bounding temporary memory.
    """
    t = _dense(t)
    sums = _device_sums(t, chunk_words).cpu().numpy().astype("<i8")
    return _xxh3(_header("device-sum64x2", t.dtype, t.shape), sums.tobytes())


def _device_sums(t: torch.Tensor, chunk_words: int = 1 << 23) -> torch.Tensor:
    """The two sums of `_device_digest` for a dense tensor, as int64[2] on its device."""
    data = _bytes(t)
    s1 = s2 = torch.zeros((), dtype=torch.int64, device=t.device)
    for start in range(0, data.numel(), 8 * chunk_words):
        chunk = data[start : start + 8 * chunk_words]
        if chunk.numel() % 8 or chunk.storage_offset() % 8:  # pad the tail, or realign
            chunk = torch.cat([chunk, chunk.new_zeros(-chunk.numel() % 8)])
        w = chunk.view(torch.int64)
        x = torch.arange(start // 8, start // 8 + w.numel(), dtype=torch.int64, device=t.device)
        x.mul_(_GOLDEN).add_(_MIX).bitwise_or_(1).mul_(w)
        s1 = s1 + x.sum()
        x.bitwise_xor_((x >> 32) & _LOW32).mul_(_MIX)
        x.bitwise_xor_((x >> 29) & _LOW35)
        s2 = s2 + x.sum()
    return torch.stack([s1, s2])
