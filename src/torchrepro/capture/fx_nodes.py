"""What a replay says about an FX node and a compiled output: the node's module, target and
user source line, and whether two values are bitwise equal. Shared by the graph replay
(:mod:`.ops`) and the kernel replay (:mod:`.kernels`)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import torch

# torch's and torchrepro's own files: a user source line is the innermost frame outside them
SKIP_DIRS = tuple(str(Path(m.__file__).parent) + os.sep for m in (torch, sys.modules[__name__.split(".")[0]]))


def clean_fqn(fqn: str) -> str:
    """Dynamo's ``L['fn']._modules['4']`` / ``L['self'].body.0`` → ``4`` / ``body.0``."""
    fqn = re.sub(r"\._modules\['([^']+)'\]", r".\1", fqn)
    fqn = re.sub(r"^L\['(self|fn|mod|model)'\]\.?", "", fqn)
    return fqn or "<root>"


def target_name(node: Any) -> str:
    """An FX node's target by name (``mul.Tensor``, ``getitem``)."""
    target = node.target
    return getattr(target, "__name__", None) or str(target).split(".")[-1]


def node_info(node: Any) -> dict[str, Any]:
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


def same(x: Any, y: Any) -> tuple[bool, float | None]:
    """(bitwise equal, max absolute difference) of two outputs (tensors, or anything else by ==)."""
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return x == y, None
    if x.shape != y.shape or x.dtype != y.dtype:
        return False, None
    if torch.equal(x.view(torch.uint8) if x.is_contiguous() else x, y.view(torch.uint8) if y.is_contiguous() else y):
        return True, 0.0
    return False, float((x.detach().double() - y.detach().double()).abs().max()) if x.numel() else 0.0
