"""A step's input digests: the DataLoader batches it fetched, fingerprinted as the iterator
hands them out; without one, the tensors passed to its outermost module call, whose device sums
are read back with the step (:mod:`.readback`)."""

from __future__ import annotations

from typing import Any

import torch

from ..digests import DeviceDigest, fingerprint, fingerprint_later, hash_bytes

Digest = str | DeviceDigest  # a fingerprint, or one whose device sums are still to be read


class StepInputs:
    """The digests of the step under way: ``batches`` (DataLoader batches, combined as each comes
    in) and ``calls`` (outermost module calls' inputs, while no batch was fetched)."""

    def __init__(self) -> None:
        self.batches: list[str] = []
        self._combined = ""  # the combination of batches
        self.calls: list[list[Digest]] = []

    def note_batch(self, batch: Any) -> None:
        try:
            self.batches.append(fingerprint(batch))
        except (TypeError, ValueError):
            self.batches.append("unhashable")
        # combined now, while the hashing code is in the caches (at the step's end it is not)
        self._combined = hash_bytes(*(f.encode() for f in self.batches))[:16]

    def note_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        tensors = _tensors((args, kwargs))
        if tensors:
            try:
                self.calls.append([fingerprint_later(local(t)) for t in tensors])
            except (TypeError, ValueError):  # sparse or nested inputs: an unhashable batch, as for the DataLoader's
                self.calls.append(["unhashable"])

    def put(self, event: Any, later: dict[str, list[list[Digest]]]) -> None:
        """The batch digests on ``event``; the module calls' to finish once read back (``later``)."""
        if self.batches:
            event.batches, event.batch_fp = len(self.batches), self._combined
        elif self.calls:
            event.batches = len(self.calls)
            later["batch"] = self.calls

    def reset(self) -> None:
        self.batches, self.calls = [], []


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2 shards, tensor-parallel pieces); a plain tensor as is."""
    return t.to_local() if hasattr(t, "to_local") else t


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    return []
