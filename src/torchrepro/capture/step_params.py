"""What a step records of the parameters: which tensors they are (the clock optimizer's, else
the leaves a loss's gradient flows into) and their names, the modules called before they were
named, whether the initial parameters were fingerprinted, which of them ``to_empty()`` left
unwritten and which hold NaN or an infinity as training starts, the gradients' digests and norms,
their fingerprints and snapshots (:mod:`.snapshots`)."""

from __future__ import annotations

import gc
import math
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import _compat as compat
from ..digests import fingerprint_later
from .snapshots import SnapshotWriter
from .step_inputs import Digest, local


NAMED_AT_MOST = 20  # tensors a NonFinite event names


@dataclass(slots=True)
class Grads:
    """A step's gradients as recorded before the update: their digests, their global norm and each
    one's norm (tensors, read back with the step), and which parameters (by position) had them."""

    digests: list[Digest]
    norm: torch.Tensor
    norms: torch.Tensor
    held_by: list[int]


class StepParams:
    """The parameters a step updates (``params``, ``names``) and what is recorded of them."""

    def __init__(self, snapshot_dir: Path | None, keep_all: bool = False):
        self.params: list[torch.Tensor] | None = None
        self.names: list[str] | None = None
        self.called: list[Any] = []  # the outermost modules called before the parameters are named
        self.init_done = False  # the initial parameters were fingerprinted
        self.grads: Grads | None = None  # the step's gradients
        self.nonfinite_grads_seen = False  # a step's gradients were found not finite (said once)
        # parameters Module.to_empty() materialised: id -> (the parameter, its versions then)
        self.materialised: dict[int, tuple[weakref.ref[torch.Tensor], tuple[int, int]]] = {}
        self.snapshot_dir = snapshot_dir
        self.keep_all = keep_all  # every snapshot step's full parameters, not only the latest
        self.last_snapshot: int | None = None
        self._snapshots: SnapshotWriter | None = None
        self._snapshots_skipped = False  # a full snapshot was not written (said once)

    def note_module(self, module: Any) -> tuple[Any, list[tuple[str, Any]]] | None:
        """An outermost module call: remembered while the parameters have no names; the first
        call of a module with parameters (not a parameter-free transform) gives the module whose
        initial parameters are fingerprinted (``torch.compile(model)``: the original) and them."""
        if self.names is None and len(self.called) < 8 and all(m is not module for m in self.called):
            self.called.append(module)
        if self.init_done:
            return None
        root = compat.compiled_original(module)
        named = [(n, p) for n, p in root.named_parameters() if not p.is_meta]
        if not named:
            return None
        self.init_done = True
        return root, named

    def name(self) -> bool:
        """Name the parameters unless named (``params`` none yet: none); True when named now."""
        if self.params is None:
            self.params = []
        if self.names is not None:
            return False
        self.names = _param_names(self.params, self.called) if self.params else []
        self.called = []
        return True

    def note_to_empty(self, module: Any) -> None:
        """``module.to_empty()`` gave its parameters memory: their versions now (one still at them at the
        first forward was never written: no init, no state dict loaded into it)."""
        if isinstance(module, torch.nn.Module):
            for p in module.parameters():
                self.materialised[id(p)] = (weakref.ref(p), _versions(p))

    def unwritten(self, named: list[tuple[str, Any]]) -> list[str]:
        """The names of ``named`` parameters that ``to_empty()`` materialised and nothing wrote since."""
        out = []
        for name, p in named:
            ref, versions = self.materialised.get(id(p), (None, None))
            alive = ref() if ref is not None else None  # the same tensor, not another at its address
            if alive is not None and alive is p and versions == _versions(alive):
                out.append(name)
        self.materialised = {}
        return out

    def note_grads(self, params: list[torch.Tensor]) -> None:
        """The gradients of ``params`` (those that have one), recorded before the update."""
        held = [(i, p.grad) for i, p in enumerate(params) if p.grad is not None]
        self.grads = _grad_digest([g for _, g in held], [i for i, _ in held])

    def nonfinite_grads(self, norms: list[float], held_by: list[int]) -> tuple[list[str], int, int]:
        """(the first names, the count, of how many) of the gradients whose norm ``norms`` (read back;
        held by the parameters at ``held_by``) is not finite; said once a run."""
        self.nonfinite_grads_seen = True
        bad = [i for i, norm in zip(held_by, norms) if not math.isfinite(norm)]
        names = self.names or []
        return [names[i] if i < len(names) else f"param{i}" for i in bad[:NAMED_AT_MOST]], len(bad), len(norms)

    def fingerprints(self) -> list[list[Digest]]:
        """The parameters' fingerprints, their device sums to read back."""
        return [[fingerprint_later(local(p)) for p in self.params or []]]

    def snapshot(self, index: int) -> str | None:
        """Snapshot the parameters after step ``index``; why a full snapshot was not written, the
        first time one is not."""
        if self._snapshots is None:
            self._snapshots = SnapshotWriter(Path(self.snapshot_dir or "snapshots"), self.keep_all)
        skipped = self._snapshots.write(index, self.names or [], self.params or [])
        self.last_snapshot = index
        if skipped and not self._snapshots_skipped:
            self._snapshots_skipped = True
            return skipped
        return None


def leaves_of(loss: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors a loss's gradient flows into (what a hand-written update changes), in
    the order autograd reaches them."""
    seen, leaves, stack = set(), [], [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        stack.extend(next_node for next_node, _ in reversed(node.next_functions))
    return leaves


def _grad_digest(grads: list[torch.Tensor], held_by: list[int]) -> Grads | None:
    """The :class:`Grads` of gradients (held by the parameters at ``held_by``), or None when there are none."""
    grads = [local(g).detach() for g in grads]
    if not grads:
        return None
    norms = torch.stack([n.float() for n in compat.foreach_norm(grads)])
    return Grads([fingerprint_later(g) for g in grads], torch.linalg.vector_norm(norms), norms, held_by)


def nonfinite_params(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """The names of the parameters (this rank's part of each) that hold NaN or an infinity: one
    reduction each (its smallest and largest value, NaN included), no copy of a tensor, and one read
    to the host per device, once."""
    flags: dict[torch.device, tuple[list[str], list[torch.Tensor]]] = {}
    for name, p in named:
        t = local(p).detach()
        if t.is_complex():
            t = torch.view_as_real(t)
        if not t.is_floating_point() or not t.numel() or t.is_meta:
            continue
        names, found = flags.setdefault(t.device, ([], []))
        names.append(name)
        found.append(~torch.isfinite(torch.stack(torch.aminmax(t.reshape(-1)))).any())
    bad = {name for names, found in flags.values() for name, b in zip(names, torch.stack(found).tolist()) if b}
    return [name for name, _ in named if name in bad]


def _versions(p: torch.Tensor) -> tuple[int, int]:
    """A parameter's version counter and its local part's (a DTensor's shard): any write in place moves one."""
    return p._version, local(p)._version


def kind(p: torch.Tensor) -> str:
    placements = getattr(p, "placements", None)
    return "tensor" if placements is None else "dtensor:" + ",".join(str(x) for x in placements)


def _is_module(obj: Any) -> bool:
    try:
        return isinstance(obj, torch.nn.Module)
    except ReferenceError:  # a dead weak proxy
        return False


def _param_names(params: list[torch.Tensor], called: Sequence[Any] = ()) -> list[str]:
    """Names of the optimizer's parameters, from the module that owns them: the one covering most
    of them with the shortest names, among the modules the script called and their submodules
    (found once per run), else among all live modules (a scan of every object, ~0.2 s)."""
    wanted = {id(p) for p in params}
    found = _best_names(wanted, _submodules(called))
    if len(found) < len(wanted):
        with warnings.catch_warnings():  # isinstance() on deprecated module attributes warns
            warnings.simplefilter("ignore")
            found = _best_names(wanted, [obj for obj in gc.get_objects() if _is_module(obj)])
    return [found.get(id(p), f"param{i}") for i, p in enumerate(params)]


def _submodules(roots: Sequence[Any]) -> list[Any]:
    found = []
    for root in roots:
        try:
            found.extend(root.modules())
        except Exception:  # a module whose modules() misbehaves: the scan of live modules decides
            continue
    return found


def _best_names(wanted: set[int], modules: list[Any]) -> dict[int, str]:
    best: tuple[int, int, dict[int, str]] | None = None
    for obj in modules:
        try:
            names = {id(p): n for n, p in obj.named_parameters() if id(p) in wanted}
        except Exception:  # dead weak proxies, modules whose named_parameters misbehave
            continue
        if not names:
            continue
        score = (len(names), -sum(len(n) for n in names.values()))
        if best is None or score > best[:2]:
            best = (*score, names)
    return best[2] if best else {}
