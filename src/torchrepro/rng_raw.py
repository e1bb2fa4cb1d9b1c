"""The global Python, numpy and torch CPU RNG states, read in place (a few µs instead of ~250).

``random.getstate()`` builds a tuple of 625 ints and numpy's ``get_state()`` copies its 624
words one numpy scalar at a time; a per-step RNG digest paid ~0.25 ms for the two. Both
generators keep their state in one C struct, so the same bytes can be read straight from
memory. The layout is never assumed: each reader is calibrated once on scratch generators
(never the global ones), its output compared with the official state functions for several
states (fresh, after draws, with a cached Gaussian); where anything differs, or on a
big-endian machine, the slow official path is used instead. The bytes are exactly those
:mod:`torchrepro.rng` hashes, so digests do not depend on which path produced them.

torch's CPU generator is only *watched* in place (:func:`host_raw`): the memory its
``get_state()`` reads (seed, position, the 624 MT19937 words, the cached normal samples) is
compared with the last step's; only when it changed is the official ``get_state()`` called.
Most training steps draw nothing from the CPU generator (GPU dropout uses the CUDA one).
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

__all__ = ["host_raw", "python_state_bytes", "numpy_state_bytes", "python_bytes", "numpy_bytes"]

if TYPE_CHECKING:
    from typing import TypeAlias

    _Chars: TypeAlias = ctypes.Array[ctypes.c_char]  # a view of raw memory
    _Spans: TypeAlias = tuple[tuple[int, int], ...]  # (address, size) of each view
    HostRaw: TypeAlias = tuple[bytes, bytes, float | None, bytes, bytes, bytes]

_WORDS = 624  # MT19937


def python_bytes(state: tuple[Any, ...]) -> bytes:
    """Canonical bytes of a ``random.getstate()`` tuple: version, 625 words, Gaussian."""
    version, internal, gauss = state
    return struct.pack(f"<q{len(internal)}Qd", version, *internal, -1.0 if gauss is None else gauss) + bytes(
        [gauss is None]
    )


def numpy_bytes(words: bytes, pos: int, has_gauss: int, cached: float) -> bytes:
    """Canonical bytes of numpy's legacy state: key words (little-endian u32), pos, Gaussian."""
    return words + struct.pack("<qqd", int(pos), int(has_gauss), float(cached))


def _python_slow(gen: random.Random) -> bytes:
    return python_bytes(gen.getstate())


def _numpy_slow(gen: np.random.RandomState) -> bytes:
    state = cast("tuple[str, np.ndarray[Any, Any], int, int, float]", gen.get_state(legacy=True))
    _, words, pos, has_gauss, cached = state
    return numpy_bytes(words.astype("<u4").tobytes(), pos, has_gauss, cached)


def _python_spans(gen: random.Random) -> _Spans:
    # _random.Random holds uint32_t state[624] and int index (getstate() = (*state, index)); their
    # offsets differ between CPython versions and are found by _calibrate()
    layout = _PY_LAYOUT
    assert layout is not None, "called only once _calibrate() found the layout"
    return (id(gen) + layout[0], 4 * _WORDS), (id(gen) + layout[1], 4)


def _numpy_spans(gen: np.random.RandomState) -> _Spans:
    # mt19937_state: uint32 key[624], int pos; after the RandomState's pointer to its own bitgen,
    # aug_bitgen_t: int has_gauss, double gauss
    return (gen._bit_generator.ctypes.state_address, 4 * _WORDS + 4), (id(gen) + _NP_AUG, 16)


def _arrays(spans: _Spans) -> tuple[_Chars, ...]:
    """ctypes char arrays over (address, size) spans: ``.raw`` copies the bytes, no foreign call."""
    return tuple((ctypes.c_char * size).from_address(address) for address, size in spans)


def _python_raw(gen: random.Random, arrays: tuple[_Chars, ...] | None = None) -> tuple[bytes, bytes, float | None]:
    state, index = arrays or _arrays(_python_spans(gen))
    return state.raw, index.raw, gen.gauss_next  # type: ignore[attr-defined]  # CPython's, not in typeshed


def _python_canonical(raw: bytes, index: bytes, gauss: float | None) -> bytes:
    tail = np.frombuffer(raw + index, dtype="<u4").astype("<u8").tobytes()
    return struct.pack("<q", 3) + tail + struct.pack("<d", -1.0 if gauss is None else gauss) + bytes([gauss is None])


def _python_fast(gen: random.Random) -> bytes:
    return _python_canonical(*_python_raw(gen))


def _numpy_raw(gen: np.random.RandomState, arrays: tuple[_Chars, ...] | None = None) -> tuple[bytes, bytes]:
    state, aug = arrays or _arrays(_numpy_spans(gen))
    return state.raw, aug.raw


def _numpy_canonical(raw: bytes, aug: bytes) -> bytes:
    pos = int.from_bytes(raw[-4:], "little", signed=True)
    has_gauss, cached = int.from_bytes(aug[:4], "little", signed=True), struct.unpack("<d", aug[8:])[0]
    return numpy_bytes(raw[:-4], pos, has_gauss, cached)


def _numpy_fast(gen: np.random.RandomState) -> bytes:
    return _numpy_canonical(*_numpy_raw(gen))


_PY_LAYOUTS = ((16, 16 + 4 * _WORDS), (20, 16))  # (state, index) offsets: state first (3.12+), index first
_PY_LAYOUT: tuple[int, int] | None = None  # set by _calibrate() when one layout reads exactly getstate()
_NP_AUG = -1  # offset of numpy's has_gauss, or -1: the official path


def _calibrate() -> None:
    global _PY_LAYOUT, _NP_AUG
    if sys.byteorder != "little":
        return
    pys = [random.Random(seed) for seed in (0, 1, 2)]
    pys[1].random()
    pys[2].gauss(0.0, 1.0)  # caches the second Gaussian
    for layout in _PY_LAYOUTS:
        if type(pys[0]).__basicsize__ < max(layout) + 4 * _WORDS:
            continue
        _PY_LAYOUT = layout
        try:
            if all(_python_fast(g) == _python_slow(g) for g in pys):
                break
        except Exception:  # noqa: BLE001 - any surprise: the official path
            pass
        _PY_LAYOUT = None
    nps = [np.random.RandomState(seed) for seed in (0, 1, 2)]
    nps[1].random_sample(3)
    nps[2].standard_normal()  # caches the second Gaussian: has_gauss = 1
    try:
        _NP_AUG = _find_aug(nps[2])
        if _NP_AUG >= 0 and not all(_numpy_fast(g) == _numpy_slow(g) for g in nps):
            _NP_AUG = -1
    except Exception:  # noqa: BLE001
        _NP_AUG = -1


def _find_aug(gen: np.random.RandomState) -> int:
    """Offset of ``has_gauss`` in a RandomState: after the pointer to the object's own bitgen
    (whose first word is the MT19937 state address)."""
    size = type(gen).__basicsize__
    base = id(gen)
    state = gen._bit_generator.ctypes.state_address
    words = struct.unpack(f"<{size // 8}Q", ctypes.string_at(base, size // 8 * 8))
    bitgen = [base + 8 * i for i, w in enumerate(words) if w == state]
    for i, w in enumerate(words[:-2]):
        if w in bitgen:
            return 8 * (i + 1)
    return -1


# Per global generator object: its arrays (made once; the object is kept, so its memory stays
# where they point), and the last raw state read with its canonical bytes: a state that has not
# changed since (the common case for ``random`` and numpy in a torch training loop) is compared,
# not converted again, and the same bytes object is returned, so digests of it can be reused too.
_ARRAYS: dict[str, tuple[tuple[Any, ...], tuple[_Chars, ...]]] = {}
_LAST: dict[str, tuple[tuple[Any, ...], bytes]] = {}


def _live_arrays(name: str, owners: tuple[Any, ...], spans: Callable[[], _Spans]) -> tuple[_Chars, ...]:
    cached = _ARRAYS.get(name)
    if cached is None or any(a is not b for a, b in zip(cached[0], owners)):
        cached = _ARRAYS[name] = (owners, _arrays(spans()))
    return cached[1]


def _memo(name: str, raw: tuple[Any, ...], canonical: Callable[..., bytes]) -> bytes:
    last = _LAST.get(name)
    if last is None or last[0] != raw:
        last = _LAST[name] = (raw, canonical(*raw))
    return last[1]


def _python_arrays(gen: random.Random) -> tuple[_Chars, ...] | None:
    """The in-place views of the global ``random`` state, or None where it cannot be read so."""
    if _PY_LAYOUT is None or type(gen) is not random.Random:
        return None
    return _live_arrays("python", (gen,), lambda: _python_spans(gen))


def _numpy_arrays(gen: np.random.RandomState) -> tuple[_Chars, ...] | None:
    """The in-place views of numpy's global legacy state, or None where it cannot be read so."""
    bitgen = gen._bit_generator
    if _NP_AUG < 0 or type(gen) is not np.random.RandomState or type(bitgen) is not np.random.MT19937:
        return None
    return _live_arrays("numpy", (gen, bitgen), lambda: _numpy_spans(gen))


def python_state_bytes() -> bytes:
    """The global ``random`` state as canonical bytes (see :func:`python_bytes`)."""
    gen = random._inst
    arrays = _python_arrays(gen)
    if arrays is None:
        return _python_slow(gen)
    return _memo("python", _python_raw(gen, arrays), _python_canonical)


def numpy_state_bytes() -> bytes:
    """numpy's global legacy state as canonical bytes (see :func:`numpy_bytes`)."""
    gen = np.random.mtrand._rand
    arrays = _numpy_arrays(gen)
    if arrays is None:
        return _numpy_slow(gen)
    return _memo("numpy", _numpy_raw(gen, arrays), _numpy_canonical)


def _peek(address: int, size: int) -> bytes | None:
    """``size`` bytes of this process's memory at ``address``, or None where they are not mapped:
    read through ``/proc/self/mem``, which answers an error where a wild pointer would crash."""
    try:
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(size)
    except (OSError, ValueError, OverflowError):
        return None
    return data if len(data) == size else None


def _torch_impl(gen: torch.Generator) -> int:
    """The address of a ``torch.Generator``'s C++ generator: the pointer its Python object holds
    after the object header (``THPGenerator.cdata``); 0 where that cannot be read."""
    field = _peek(id(gen) + object.__basicsize__, 8) if type(gen).__basicsize__ >= 24 else None
    return int.from_bytes(field, "little") if field else 0


def _torch_layout(gen: torch.Generator, start: int) -> tuple[int, int] | None:
    """(offset, size) of ``gen``'s state in its C++ generator when it begins at ``start``,
    checked against ``get_state()``: ``seed_`` (u64), ``left_`` (i32), ``seeded_``, ``next_``
    (u32), ``state_`` (624 u32), then the cached float and double normal samples
    (``std::optional``); None where the memory there holds something else."""
    official = gen.get_state().numpy().tobytes()
    state = start + 20
    double = (state + 4 * _WORDS + 7) // 8 * 8 + 8  # after optional<float>: value, engaged, pad
    size = double + 16 - start
    impl = _torch_impl(gen)
    span = _peek(impl + start, size) if impl and start >= 0 and start % 8 == 0 else None
    if span is None or span[:12] != official[:12]:  # seed_, left_
        return None
    words = np.frombuffer(official, dtype="<u8", offset=24, count=_WORDS).astype("<u4").tobytes()
    if span[20 : 20 + len(words)] != words or span[16:20] != official[16:20]:  # state_, next_
        return None
    normal_y, valid = struct.unpack_from("<8xd8xi", official, 24 + 8 * _WORDS)
    at = double - start
    if span[at + 8] != valid or (valid and span[at : at + 8] != struct.pack("<d", normal_y)):
        return None
    return start, size


def _find_torch_span() -> tuple[int, int] | None:
    """The layout of :func:`_torch_layout`, found on a scratch generator; kept only if, through
    draws of every kind and reseeding, each change of ``get_state()`` changed the span too."""
    gen = torch.Generator().manual_seed(0x5EED_7A3C_91B2_D04F)  # a seed no other field holds
    impl = _torch_impl(gen)
    head = _peek(impl, 256) if impl else None  # a CPU generator is ~2.6 KB
    layout = _torch_layout(gen, head.find(gen.get_state().numpy().tobytes()[:12])) if head else None
    if layout is None:
        return None
    start, size = layout
    steps = (
        lambda: torch.randn(1, generator=gen),  # one sample used, its pair cached
        lambda: torch.rand(1, generator=gen),  # one word: only the position moves
        lambda: torch.randn(1, generator=gen),  # the cached sample used
        lambda: torch.rand(700, generator=gen),  # past a twist of the 624 words
        lambda: torch.randn(33, generator=gen),  # the vectorised normal path
        lambda: gen.manual_seed(7),
        lambda: gen.manual_seed(7),
    )
    last = (gen.get_state().numpy().tobytes(), _peek(impl + start, size))
    for step in steps:
        step()
        now = (gen.get_state().numpy().tobytes(), _peek(impl + start, size))
        if now[1] is None or (now[0] != last[0] and now[1] == last[1]) or _torch_layout(gen, start) != layout:
            return None
        last = now
    return layout


class _HostReader:
    """The three global generators' objects and ctypes views of their state in memory (the
    Python and numpy views those of :func:`python_state_bytes` and :func:`numpy_state_bytes`)."""

    def __init__(self, arrays: tuple[_Chars, ...]) -> None:
        self.py, self.np = random._inst, np.random.mtrand._rand
        self.bitgen, self.torch = self.np._bit_generator, torch.default_generator
        self.arrays = arrays

    @staticmethod
    def make() -> _HostReader | None:
        """A reader of the current global generators, where each can be read in place."""
        if _TORCH_SPAN is None:
            return None
        py, npr = _python_arrays(random._inst), _numpy_arrays(np.random.mtrand._rand)
        if py is None or npr is None or not _default_generator_checked(_TORCH_SPAN):
            return None
        start, size = _TORCH_SPAN
        return _HostReader((*py, *npr, *_arrays(((_torch_impl(torch.default_generator) + start, size),))))

    def current(self) -> bool:
        return (
            random._inst is self.py
            and np.random.mtrand._rand is self.np
            and self.np._bit_generator is self.bitgen
            and torch.default_generator is self.torch
        )


_HOST: list[_HostReader] = []
_DEFAULT_CHECKED: list[bool] = []  # whether torch.default_generator has the scratch generator's layout


def _default_generator_checked(span: tuple[int, int]) -> bool:
    """Whether the default generator has ``span`` (the scratch generator's layout). Checked once per
    process (the default generator is one object for its whole life): a failure must not be paid
    again at every step."""
    if not _DEFAULT_CHECKED:
        _DEFAULT_CHECKED.append(_torch_layout(torch.default_generator, span[0]) == span)
    return _DEFAULT_CHECKED[0]


def host_raw() -> HostRaw | None:
    """The raw state of Python's ``random``, numpy's legacy global generator and torch's CPU
    generator, as one tuple of bytes: equal tuples mean unchanged states. None where a
    generator cannot be read in place (the official paths decide)."""
    if not _HOST or not _HOST[0].current():
        reader = _HostReader.make()
        if reader is None:
            return None
        _HOST[:] = [reader]
    reader = _HOST[0]
    a = reader.arrays
    return a[0].raw, a[1].raw, reader.py.gauss_next, a[2].raw, a[3].raw, a[4].raw  # type: ignore[attr-defined]


_calibrate()
try:
    _TORCH_SPAN = _find_torch_span() if sys.byteorder == "little" else None
except Exception:  # noqa: BLE001 - any surprise: the official get_state() every time
    _TORCH_SPAN = None
