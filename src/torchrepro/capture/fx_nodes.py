"""What a replay says about an FX node and a compiled output: the node's module, target and
user source line, and whether two values are bitwise equal. Shared by the graph replay
(:mod:`.ops`) and the kernel replay (:mod:`.kernels`)."""

from __future__ import annotations

import inspect
import math
import os
import re
import struct
import sys
from pathlib import Path
from typing import Any

import torch

from ..digests import fingerprint
from ..eventlog.payloads import NodeInfo

# torch's and torchrepro's own files: a user source line is the innermost frame outside them
SKIP_DIRS = tuple(str(Path(inspect.getfile(m)).parent) + os.sep for m in (torch, sys.modules[__name__.split(".")[0]]))


def clean_fqn(fqn: str) -> str:
    """Dynamo's ``L['fn']._modules['4']`` / ``L['self'].body.0`` → ``4`` / ``body.0``."""
    fqn = re.sub(r"\._modules\['([^']+)'\]", r".\1", fqn)
    fqn = re.sub(r"^L\['(self|fn|mod|model)'\]\.?", "", fqn)
    return fqn or "<root>"


def target_name(node: Any) -> str:
    """An FX node's target by name (``mul.Tensor``, ``getitem``)."""
    target = node.target
    return getattr(target, "__name__", None) or str(target).split(".")[-1]


def node_info(node: Any) -> NodeInfo:
    """An FX node's name, target, module (``body.0 (Linear)``) and user source line."""
    stack = node.meta.get("nn_module_stack") or {}
    module = None
    if stack:
        fqn, cls = list(stack.values())[-1]
        module = f"{clean_fqn(fqn)} ({getattr(cls, '__name__', cls)})"
    frames = re.findall(r'File "(.+?)", line (\d+)', node.meta.get("stack_trace") or "")
    # the innermost frame of the user's code (not torch's, not torchrepro's own wrappers)
    user = [f for f in frames if not f[0].startswith(SKIP_DIRS)] or frames
    source = f"{user[-1][0]}:{user[-1][1]}" if user else None
    return {"node": node.name, "target": target_name(node), "module": module, "source": source}


def leaves(x: Any) -> list[Any]:
    """A compiled graph's outputs as a flat list: nested tuples and lists opened, ``None`` and
    Python scalars kept in place (the order FX's output node lists them in)."""
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in leaves(item)]
    return [x]


def first_line(exc: BaseException) -> str:
    """``TypeError: what went wrong`` — an exception's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def same(x: Any, y: Any) -> tuple[bool, float | None]:
    """(bitwise equal, max absolute difference) of two outputs of a graph: tensors of any dtype,
    shape (0-dim, zero-size), layout or strides (views) bit for bit through their digests; nested
    tuples element by element; ``None`` and Python scalars by value (floats bit for bit)."""
    if isinstance(x, (list, tuple)) or isinstance(y, (list, tuple)):
        a, b = leaves(x), leaves(y)
        if len(a) != len(b):
            return False, None
        pairs = [same(p, q) for p, q in zip(a, b)]
        diffs = [d for _, d in pairs if d is not None]
        return all(e for e, _ in pairs), max(diffs) if diffs else None
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        if isinstance(x, float) and isinstance(y, float):
            equal = struct.pack("<d", x) == struct.pack("<d", y)
            return equal, 0.0 if equal else abs(x - y)
        return type(x) is type(y) and bool(x == y), None
    if x.shape != y.shape or x.dtype != y.dtype:
        return False, None
    try:
        equal = fingerprint(x) == fingerprint(y)
    except TypeError:  # a layout digests do not read (sparse, nested): compare values
        equal = bool(torch.equal(x, y))
    if equal:
        return True, 0.0
    return False, _max_abs(x, y)


def _max_abs(x: torch.Tensor, y: torch.Tensor) -> float | None:
    """The largest absolute difference of two same-shaped tensors, ``inf`` where a value that is not
    finite meets another (None when empty, on the meta device, or when their values cannot be
    subtracted, e.g. quantized)."""
    if not x.numel() or x.is_meta or y.is_meta:
        return None
    wide = torch.complex128 if x.dtype.is_complex else torch.float64
    try:
        a, b = x.detach().to(wide), y.detach().to(wide)
        alike = (a == b) | (a.isnan() & b.isnan())  # NaNs of other bits: their digests already differ
        return float(torch.where(alike, 0.0, (a - b).abs().nan_to_num(nan=math.inf)).abs().max())
    except (RuntimeError, TypeError):
        return None
