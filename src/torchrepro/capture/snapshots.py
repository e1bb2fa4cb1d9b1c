"""Parameter snapshots (``run --snapshots``, every ``check --against`` or ``--rtol``/``--atol`` run):
what the divergence curve is drawn from, in disk bounded by the model, not by the model times the steps.

At each snapshot step (0-15, powers of two, the last) a run writes ``sketch-<step>.npz``: per
parameter tensor its bitwise fingerprint, L2 norm and largest magnitude (exact), and a count
sketch of its values, at most :data:`SKETCH_BYTES` for the whole model. Tensors of at most
``dims`` elements are kept whole in it. The full values, ``step-<step>.npz``, are kept for two
steps: the first snapshot step (where a race between threads or a compiled-vs-eager difference
first shows) and the latest, which replaces the one before (removed before the next is written:
never more than two copies).

The count sketch projects a flattened tensor ``x`` of ``n`` elements to ``k`` dims:
``y[h(i) mod k] += s(i) * x[i]`` with a bucket ``h`` and sign ``s`` taken from a 64-bit integer
hash (SplitMix64's finaliser) of the element's index and a seed from the tensor's name: the same
projection in every run and on every device, and no draw from any random number generator. It is
linear, so two runs' sketches subtract to the sketch of their difference ``d``, whose squared norm
estimates ``|d|²`` without bias with variance at most ``2|d|⁴/k`` (the analysis turns this into an
error bound: :func:`torchrepro.analysis.divergence.sketch_error`). Sums are float64 and taken in
a fixed order on the CPU, so equal tensors give equal sketches.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..digests import fingerprint, hash_bytes
from ..eventlog.rundir import atomic_path

SKETCH_BYTES = 1_000_000  # a step's sketch file, at most (names and statistics included)
SCHEME = "countsketch-splitmix64-1"  # what a sketch file's projection is; only equal schemes compare
_MARGIN = 1 << 20  # left free on the disk beside a full snapshot (event logs go on being written)
_CHUNK = 1 << 20  # elements hashed at a time (bounds the int64 temporaries)
_MASK64 = (1 << 64) - 1
_C1, _C2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 that has its bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr_(z: torch.Tensor, s: int, out: torch.Tensor) -> torch.Tensor:
    """Logical right shift of int64 bits into ``out`` (torch's ``>>`` is arithmetic)."""
    return torch.bitwise_right_shift(z, s, out=out).bitwise_and_((1 << (64 - s)) - 1)


def mix(index: torch.Tensor, seed: int) -> torch.Tensor:
    """SplitMix64's finaliser of ``index + seed`` (int64, wrapping; ``index`` is overwritten):
    64 well-mixed bits per element."""
    z, t = index.add_(_signed(seed & _MASK64)), torch.empty_like(index)
    z.bitwise_xor_(_shr_(z, 30, t)).mul_(_signed(_C1))
    z.bitwise_xor_(_shr_(z, 27, t)).mul_(_signed(_C2))
    return z.bitwise_xor_(_shr_(z, 31, t))


def tensor_seed(name: str) -> int:
    """The projection's seed for the parameter ``name`` (the same in every run)."""
    return int(hash_bytes(SCHEME.encode(), name.encode())[:15], 16)


def count_sketch(x: torch.Tensor, k: int, seed: int) -> np.ndarray[Any, Any]:
    """The ``k``-dim count sketch of ``x`` (any shape; its values as float64), or ``x`` itself
    flattened when it has at most ``k`` elements."""
    sketch: np.ndarray[Any, Any] = _sketch(x, k, seed)[0].cpu().numpy()
    return sketch


def _sketch(x: torch.Tensor, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(:func:`count_sketch`, sum of squares, largest magnitude) of ``x`` as float64 tensors on
    its device (a CUDA tensor's; else the CPU), a chunk of elements at a time: no float64 copy of
    a whole tensor, no device sync."""
    flat = x.detach().reshape(-1)
    if flat.device.type != "cuda":  # (some devices have no float64)
        flat = flat.cpu()
    n, dev = flat.numel(), flat.device
    squares, largest = (
        torch.zeros((), dtype=torch.float64, device=dev),
        torch.zeros((), dtype=torch.float64, device=dev),
    )
    if n <= k:
        whole = flat.to(torch.float64)
        if n:
            squares, largest = whole.square().sum(), whole.abs().max()
        return whole, squares, largest
    out = torch.zeros(k, dtype=torch.float64, device=dev)
    base = torch.arange(min(n, _CHUNK), dtype=torch.int64, device=dev)
    for start in range(0, n, _CHUNK):
        end = min(n, start + _CHUNK)
        values = flat[start:end].to(torch.float64)
        squares += values.square().sum()
        largest = torch.maximum(largest, values.abs().max())
        h = mix(base[: end - start] + start, seed)
        values.mul_((h & 1).to(torch.float64).mul_(-2).add_(1))  # the sign: bit 0
        bucket = _shr_(h, 32, h).mul_(k).bitwise_right_shift_(32)  # the top 32 bits scaled to [0, k)
        out.index_add_(0, bucket, values)
    return out, squares, largest


def sketch_dims(names: list[str], sizes: list[int], budget: int = SKETCH_BYTES) -> int:
    """The dims ``k`` of every tensor's sketch: the largest with which a step's sketch file fits
    ``budget`` (float64 values; the names, fingerprints and statistics beside them), at least 16."""
    longest = max((len(n) for n in names), default=0)
    fixed = 4096 + len(names) * (4 * longest + 4 * 16 + 4 * 8)  # names and fingerprints as numpy str arrays
    room = max(0, budget - fixed) // 8
    if sum(sizes) <= room:
        return max(sizes, default=16)
    lo, hi = 16, max(sizes, default=16)
    while lo < hi:  # the largest k with sum(min(n, k)) <= room
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in sizes) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SnapshotWriter:
    """Writes a run's snapshots into ``folder``: a sketch per snapshot step, the full parameters
    of the first one and the latest (of every one with ``keep_all``: ``compare`` judges each
    tensor at each step)."""

    def __init__(self, folder: Path, keep_all: bool = False):
        self.folder = folder
        self.keep_all = keep_all
        self.first: int | None = None  # the step of the first full snapshot, kept
        self.last: int | None = None  # the step of the latest full snapshot kept
        self._dims: int | None = None

    def write(self, index: int, names: list[str], params: list[torch.Tensor]) -> str | None:
        """The sketch of step ``index``, then its full values in place of the latest step kept
        (but the first); what was not written and why (the disk cannot hold the full values: the
        step before stays the one kept), else None."""
        self.folder.mkdir(parents=True, exist_ok=True)
        # a tensor on the meta device holds no values (an optimizer made before to_empty() holds such): left out
        kept = [(name, t) for name, t in zip(names, map(_local, params)) if not t.is_meta]
        names, local = [name for name, _ in kept], [t for _, t in kept]
        if self._dims is None:
            self._dims = sketch_dims(names, [t.numel() for t in local])
        parts = [_sketch(t, self._dims, tensor_seed(name)) for name, t in zip(names, local)]
        where = parts[0][0].device if parts else torch.device("cpu")  # read back at once: one sync
        sketches = [p[0].to(where) for p in parts]
        stats = torch.stack([torch.stack(p[1:]).to(where) for p in parts]).cpu().numpy() if parts else np.zeros((0, 2))
        with atomic_path(self.folder / f"sketch-{index:07d}.npz") as tmp, open(tmp, "wb") as fp:
            np.savez(
                fp,
                scheme=np.array(SCHEME),
                names=np.array(names, dtype=str),
                fps=np.array([fingerprint(t)[:16] for t in local], dtype=str),
                numel=np.array([t.numel() for t in local], dtype=np.int64),
                dims=np.array([len(s) for s in sketches], dtype=np.int64),
                sketch=torch.cat(sketches).cpu().numpy() if sketches else np.zeros(0),
                l2=np.sqrt(stats[:, 0]),
                max_abs=stats[:, 1],
            )
        need = sum(t.numel() * max(4, t.element_size()) for t in local) + _MARGIN
        replaced = None
        if self.last not in (None, self.first, index) and not self.keep_all:
            replaced = self.folder / f"step-{self.last:07d}.npz"
        free = shutil.disk_usage(self.folder).free + (replaced.stat().st_size if replaced and replaced.exists() else 0)
        if free < need:
            return (
                f"step {index}'s parameters not kept whole: {free >> 20} MiB free, {need >> 20} MiB needed "
                "(its sketch is; the divergence curve estimates its difference)"
            )
        if replaced is not None:  # before the next is written: two copies at most
            replaced.unlink(missing_ok=True)
        host = [t.cpu() for t in local]
        # Any: numpy's stub would match a dict of arrays, unpacked, against savez's allow_pickle: bool
        arrays: dict[str, Any] = {name: _to_numpy(t) for name, t in zip(names, host)}
        with atomic_path(self.folder / f"step-{index:07d}.npz") as tmp, open(tmp, "wb") as fp:
            np.savez(fp, **arrays)
        self.first = index if self.first is None else self.first
        self.last = index
        return None


def _local(p: torch.Tensor) -> torch.Tensor:
    """This rank's values of ``p`` (a DTensor's local part; a complex tensor's as real pairs)."""
    local = (p.to_local() if hasattr(p, "to_local") else p).detach()
    return torch.view_as_real(local) if local.is_complex() else local


def _to_numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    wide = t.float() if t.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) else t
    array: np.ndarray[Any, Any] = wide.numpy().copy()
    return array
