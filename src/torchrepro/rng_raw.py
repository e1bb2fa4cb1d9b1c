"""The global Python and numpy RNG states as bytes, read in place (a few µs instead of ~250).

``random.getstate()`` builds a tuple of 625 ints and numpy's ``get_state()`` copies its 624
words one numpy scalar at a time; a per-step RNG digest paid ~0.25 ms for the two. Both
generators keep their state in one C struct, so the same bytes can be read straight from
memory. The layout is never assumed: each reader is calibrated once on scratch generators
(never the global ones), its output compared with the official state functions for several
states (fresh, after draws, with a cached Gaussian); where anything differs, or on a
big-endian machine, the slow official path is used instead. The bytes are exactly those
:mod:`torchrepro.rng` hashes, so digests do not depend on which path produced them.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["python_state_bytes", "numpy_state_bytes", "python_bytes", "numpy_bytes"]

_WORDS = 624  # MT19937


def python_bytes(state: tuple) -> bytes:
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
    _, words, pos, has_gauss, cached = gen.get_state(legacy=True)
    return numpy_bytes(words.astype("<u4").tobytes(), pos, has_gauss, cached)


def _python_spans(gen: random.Random) -> tuple[tuple[int, int], ...]:
    # _random.Random holds uint32_t state[624] and int index (getstate() = (*state, index)); their
    # offsets differ between CPython versions and are found by _calibrate()
    return (id(gen) + _PY_LAYOUT[0], 4 * _WORDS), (id(gen) + _PY_LAYOUT[1], 4)


def _numpy_spans(gen: np.random.RandomState) -> tuple[tuple[int, int], ...]:
    # mt19937_state: uint32 key[624], int pos; after the RandomState's pointer to its own bitgen,
    # aug_bitgen_t: int has_gauss, double gauss
    return (gen._bit_generator.ctypes.state_address, 4 * _WORDS + 4), (id(gen) + _NP_AUG, 16)


def _arrays(spans: tuple[tuple[int, int], ...]) -> tuple[ctypes.Array, ...]:
    """ctypes char arrays over (address, size) spans: ``.raw`` copies the bytes, no foreign call."""
    return tuple((ctypes.c_char * size).from_address(address) for address, size in spans)


def _python_raw(
    gen: random.Random, arrays: tuple[ctypes.Array, ...] | None = None
) -> tuple[bytes, bytes, float | None]:
    state, index = arrays or _arrays(_python_spans(gen))
    return state.raw, index.raw, gen.gauss_next


def _python_canonical(raw: bytes, index: bytes, gauss: float | None) -> bytes:
    tail = np.frombuffer(raw + index, dtype="<u4").astype("<u8").tobytes()
    return struct.pack("<q", 3) + tail + struct.pack("<d", -1.0 if gauss is None else gauss) + bytes([gauss is None])


def _python_fast(gen: random.Random) -> bytes:
    return _python_canonical(*_python_raw(gen))


def _numpy_raw(gen: np.random.RandomState, arrays: tuple[ctypes.Array, ...] | None = None) -> tuple[bytes, bytes]:
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
_ARRAYS: dict[str, tuple[tuple[Any, ...], tuple[ctypes.Array, ...]]] = {}
_LAST: dict[str, tuple[tuple, bytes]] = {}


def _live_arrays(name: str, owners: tuple[Any, ...], spans: Callable[[], tuple]) -> tuple[ctypes.Array, ...]:
    cached = _ARRAYS.get(name)
    if cached is None or any(a is not b for a, b in zip(cached[0], owners)):
        cached = _ARRAYS[name] = (owners, _arrays(spans()))
    return cached[1]


def _memo(name: str, raw: tuple, canonical: Callable[..., bytes]) -> bytes:
    last = _LAST.get(name)
    if last is None or last[0] != raw:
        last = _LAST[name] = (raw, canonical(*raw))
    return last[1]


def python_state_bytes() -> bytes:
    """The global ``random`` state as canonical bytes (see :func:`python_bytes`)."""
    gen = random._inst
    if _PY_LAYOUT is not None and type(gen) is random.Random:
        arrays = _live_arrays("python", (gen,), lambda: _python_spans(gen))
        return _memo("python", _python_raw(gen, arrays), _python_canonical)
    return _python_slow(gen)


def numpy_state_bytes() -> bytes:
    """numpy's global legacy state as canonical bytes (see :func:`numpy_bytes`)."""
    gen = np.random.mtrand._rand
    bitgen = gen._bit_generator
    if _NP_AUG >= 0 and type(gen) is np.random.RandomState and type(bitgen) is np.random.MT19937:
        arrays = _live_arrays("numpy", (gen, bitgen), lambda: _numpy_spans(gen))
        return _memo("numpy", _numpy_raw(gen, arrays), _numpy_canonical)
    return _numpy_slow(gen)


_calibrate()
