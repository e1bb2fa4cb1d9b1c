"""RngState: capture, restore, save and load every random generator of a process.

Covers Python ``random``, numpy's legacy global RNG, torch CPU, every CUDA device, and the
generators registered with :func:`register` (DataLoader and sampler ``torch.Generator``s,
numpy ``Generator``s). Files are JSON (bytes as base64) with a sha256 of their content:
nothing is unpickled, and a truncated or edited file is refused with a clear error.
"""

from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union, cast

import numpy as np
import torch

from . import _dist, _state
from .digests import hash_bytes
from .errors import RngStateError
from .rng_raw import host_raw, numpy_bytes, numpy_state_bytes, python_bytes, python_state_bytes
from .eventlog.rundir import write_text

SCHEMA = "torchrepro.rng/1"

Generator = Union[torch.Generator, np.random.Generator]


def register(name: str, generator: Generator) -> Generator:
    """Register a ``torch.Generator`` or numpy ``Generator`` so that :meth:`RngState.capture`
    saves it and :meth:`RngState.restore` restores it.

    >>> g = register("sampler", torch.Generator().manual_seed(0))
    """
    if not isinstance(generator, (torch.Generator, np.random.Generator)):
        raise TypeError(f"cannot register {type(generator).__name__}: need torch.Generator or numpy Generator")
    _state.add_generator(name, generator)
    return generator


def registered() -> dict[str, Generator]:
    """The registered generators, by name."""
    return _state.generators()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


@dataclass
class RngState:
    """The state of every generator of this process, as plain JSON-able data.

    >>> state = RngState.capture()
    >>> a = torch.rand(3)
    >>> state.restore()
    >>> torch.equal(a, torch.rand(3))
    True
    """

    python: list[Any]
    numpy: dict[str, Any]
    torch_cpu: str
    cuda: list[str] = field(default_factory=list)
    generators: dict[str, dict[str, Any]] = field(default_factory=dict)
    forks: dict[str, dict[str, Any]] = field(default_factory=dict)
    rank: int = 0
    world_size: int = 1
    torch_version: str = torch.__version__

    @classmethod
    def capture(cls, generators: dict[str, Generator] | None = None) -> RngState:
        """Snapshot every generator, plus the registered ones and ``generators``."""
        version, internal, gauss = random.getstate()
        legacy = cast("tuple[str, np.ndarray[Any, Any], int, int, float]", np.random.get_state(legacy=True))
        key, words, pos, has_gauss, cached = legacy
        cuda = []
        if torch.cuda.is_available():
            cuda = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
        here = _dist.placement()
        return cls(
            python=[version, list(internal), gauss],
            numpy={
                "key": key,
                "words": _b64(words.astype("<u4").tobytes()),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            torch_cpu=_b64(torch.get_rng_state().numpy().tobytes()),
            cuda=cuda,
            generators={name: _generator_state(g) for name, g in {**registered(), **(generators or {})}.items()},
            forks={
                key: {
                    "cpu": _b64(st["cpu"].numpy().tobytes()),
                    "cuda": [_b64(c.numpy().tobytes()) for c in st.get("cuda", [])],
                }
                for key, st in _state.fork_states().items()
            },
            rank=here.rank,
            world_size=here.world_size,
        )

    def restore(self, generators: dict[str, Generator] | None = None) -> None:
        """Put every generator back into this state. A generator in the state that is not
        registered (nor in ``generators``) is an error, not silently skipped."""
        targets = {**registered(), **(generators or {})}
        missing = sorted(set(self.generators) - set(targets))
        if missing:
            raise RngStateError(
                f"the RNG state has generators {missing} that are not registered here: "
                "register them with torchrepro.rng.register(name, generator) first"
            )
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.cuda and len(self.cuda) != cuda_count:
            raise RngStateError(f"the RNG state has {len(self.cuda)} CUDA device(s), this process sees {cuda_count}")
        version, internal, gauss = self.python
        random.setstate((version, tuple(internal), gauss))
        n = self.numpy
        words = np.frombuffer(_unb64(n["words"]), dtype="<u4").astype(np.uint32)
        np.random.set_state((n["key"], words, n["pos"], n["has_gauss"], n["cached_gaussian"]))
        torch.set_rng_state(_byte_tensor(self.torch_cpu))
        if self.cuda:
            torch.cuda.set_rng_state_all([_byte_tensor(s) for s in self.cuda])
        for name, saved in self.generators.items():
            _set_generator_state(name, targets[name], saved)
        if self.forks:
            if _state.seed_root() is None:
                raise RngStateError(
                    "the RNG state holds plan.fork() streams: call torchrepro.seed_everything(seed) before restoring it"
                )
            _state.fork_states().update(
                {
                    key: {
                        "cpu": _byte_tensor(st["cpu"]),
                        **({"cuda": [_byte_tensor(c) for c in st["cuda"]]} if st["cuda"] else {}),
                    }
                    for key, st in self.forks.items()
                }
            )

    def fingerprint(self) -> str:
        """A short stable hex digest of every generator's state (not of rank or versions)."""
        return combine(self.fingerprints())

    def fingerprints(self) -> dict[str, str]:
        """Per-generator digests (``python``, ``numpy``, ``torch_cpu``, ``cuda:0``,
        ``generator:<name>``), equal to :func:`live_fingerprints` taken at capture time."""
        words = _unb64(self.numpy["words"])
        raw = {
            "python": python_bytes(tuple(self.python)),
            "numpy": numpy_bytes(words, self.numpy["pos"], self.numpy["has_gauss"], self.numpy["cached_gaussian"]),
            "torch_cpu": _unb64(self.torch_cpu),
        }
        raw.update({f"cuda:{i}": _unb64(s) for i, s in enumerate(self.cuda)})
        for name, saved in self.generators.items():
            raw[f"generator:{name}"] = _generator_bytes(saved)
        for key, st in self.forks.items():
            raw[f"fork:{key}"] = _unb64(st["cpu"]) + b"".join(_unb64(c) for c in st["cuda"])
        return {name: hash_bytes(data)[:16] for name, data in raw.items()}

    def to_json(self) -> dict[str, Any]:
        payload = {
            "python": self.python,
            "numpy": self.numpy,
            "torch_cpu": self.torch_cpu,
            "cuda": self.cuda,
            "generators": self.generators,
            "forks": self.forks,
            "rank": self.rank,
            "world_size": self.world_size,
            "torch_version": self.torch_version,
        }
        return {"schema": SCHEMA, "sha256": hashlib.sha256(_canonical(payload)).hexdigest(), "state": payload}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write this state atomically; a directory gets ``rng-rank<r>.json`` (one file per
        global rank). Returns the file written."""
        target = _rank_file(Path(path), self.rank)
        write_text(target, json.dumps(self.to_json()))
        return target

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        allow_version_mismatch: bool = False,
    ) -> RngState:
        """Read a state saved by :meth:`save` for this rank (``rank``/``world_size`` default to
        this process's). A different world size, another torch version (unless
        ``allow_version_mismatch``), a truncated or edited file raise :class:`RngStateError`."""
        here = _dist.placement()
        rank = here.rank if rank is None else rank
        world_size = here.world_size if world_size is None else world_size
        file = _rank_file(Path(path), rank)
        try:
            doc = json.loads(file.read_text())
        except FileNotFoundError:
            raise RngStateError(f"no RNG state file {file} (saved for another rank or world size?)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RngStateError(f"{file} is not a readable RNG state (truncated or corrupt): {exc}") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("state"), dict):
            raise RngStateError(f"{file} is not a {SCHEMA} file")
        payload = doc["state"]
        if hashlib.sha256(_canonical(payload)).hexdigest() != doc.get("sha256"):
            raise RngStateError(f"{file} is corrupt: its content does not match its sha256")
        if payload["world_size"] != world_size:
            raise RngStateError(
                f"{file} was saved by a job of world size {payload['world_size']}, this job has "
                f"{world_size}: RNG streams cannot be mapped between world sizes; re-derive them "
                "with torchrepro.seed_everything instead"
            )
        if payload["torch_version"] != torch.__version__ and not allow_version_mismatch:
            raise RngStateError(
                f"{file} was saved with torch {payload['torch_version']}, this is torch "
                f"{torch.__version__}; pass allow_version_mismatch=True if you accept that"
            )
        try:
            return cls(**payload)
        except TypeError as exc:
            raise RngStateError(f"{file} has an unexpected layout: {exc}") from None


def live_fingerprints(generators: dict[str, Generator] | None = None) -> dict[str, str]:
    """Per-generator digests of the current state, without building an :class:`RngState`
    (cheap enough for every training step; CUDA only if it is already initialised)."""
    host = _host_digests()
    cuda = torch.cuda.is_initialized()  # implies is_available(), which costs more
    if not (cuda or generators or _state.has_streams()):
        return host  # the same dict as long as no host generator changed: nothing else to compare
    raw = {}
    if cuda:
        raw.update({f"cuda:{i}": s.numpy().tobytes() for i, s in enumerate(torch.cuda.get_rng_state_all())})
    for name, g in {**registered(), **(generators or {})}.items():
        raw[f"generator:{name}"] = _generator_bytes(_generator_state(g))
    for key, st in _state.fork_states().items():
        raw[f"fork:{key}"] = st["cpu"].numpy().tobytes() + b"".join(c.numpy().tobytes() for c in st.get("cuda", []))
    return {**host, **{name: _short_digest(name, data) for name, data in raw.items()}}


_HOST_LAST: list[Any] = [None, None]  # host_raw() when last read, and the digests of those states


def _host_digests() -> dict[str, str]:
    """The digests of Python's, numpy's and torch's CPU generator; while their memory is
    unchanged since the last call (most training steps draw from none of them), that call's
    digests again, without reading their official states."""
    raw = host_raw()
    if raw is not None and raw == _HOST_LAST[0]:
        last: dict[str, str] = _HOST_LAST[1]
        return last
    digests = {
        "python": _short_digest("python", python_state_bytes()),
        "numpy": _short_digest("numpy", numpy_state_bytes()),
        # what torch.get_rng_state() returns
        "torch_cpu": _short_digest("torch_cpu", _host_bytes(torch.default_generator.get_state())),
    }
    _HOST_LAST[:] = raw, digests
    return digests


def _host_bytes(state: torch.Tensor) -> bytes:
    """The bytes of a generator state (a new contiguous uint8 CPU tensor), copied in one call:
    inside a training step, where caches are cold, a third of the time ``numpy().tobytes()`` takes."""
    return ctypes.string_at(state.data_ptr(), state.numel())


_LAST_DIGESTS: dict[str, tuple[bytes, str]] = {}


def _short_digest(name: str, data: bytes) -> str:
    """``hash_bytes(data)[:16]``; the last digest of generator ``name`` again if its state is unchanged."""
    last = _LAST_DIGESTS.get(name)
    if last is None or (last[0] is not data and last[0] != data):
        last = _LAST_DIGESTS[name] = (data, hash_bytes(data)[:16])
    return last[1]


def combine(fingerprints: dict[str, str]) -> str:
    """One digest over per-generator digests (order-independent)."""
    return hash_bytes(_canonical(fingerprints))[:16]


def _rank_file(path: Path, rank: int) -> Path:
    return path if path.suffix == ".json" else path / f"rng-rank{rank}.json"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _byte_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(_unb64(text)), dtype=torch.uint8)


def _generator_state(g: Generator) -> dict[str, Any]:
    if isinstance(g, torch.Generator):
        return {"kind": "torch", "device": str(g.device), "state": _b64(g.get_state().numpy().tobytes())}
    return {"kind": "numpy", "state": _jsonable(g.bit_generator.state)}


def _generator_bytes(saved: dict[str, Any]) -> bytes:
    """What a generator's fingerprint digests: its torch state bytes, or its numpy state as canonical JSON."""
    return _unb64(saved["state"]) if saved["kind"] == "torch" else _canonical(saved["state"])


def _set_generator_state(name: str, g: Generator, saved: dict[str, Any]) -> None:
    kind = "torch" if isinstance(g, torch.Generator) else "numpy"
    if saved.get("kind") != kind:
        raise RngStateError(f"generator {name!r} was a {saved.get('kind')} generator, it is a {kind} one here")
    if isinstance(g, torch.Generator):
        g.set_state(_byte_tensor(saved["state"]))
    else:
        g.bit_generator.state = saved["state"]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.integer):
        return int(value)
    return value
