"""Op-level capture for replays: every aten op of one training step, with its module, phase,
source line and bitwise digests of its inputs and outputs.

Used only in a *replay* of a step (``torchrepro run --replay-step K``), never in the runs being
compared: a dispatch mode and global module hooks change how code runs (compiled code is run
eagerly in an eager replay), which is fine for explaining a divergence and wrong for measuring one.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..fingerprint import fingerprint

_UNINITIALISED = re.compile(r"\bempty|_empty")
_SKIP_DIRS = tuple(str(Path(m.__file__).parent) + os.sep for m in (torch, sys.modules[__name__.split(".")[0]]))


def _digests(values: Any) -> list[str | None]:
    leaves, _ = tree_flatten(values)
    return [fingerprint(v)[:16] if isinstance(v, torch.Tensor) else None for v in leaves
            if isinstance(v, torch.Tensor)]


def _user_source() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_DIRS) and not filename.startswith("<"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


class OpRecorder(TorchDispatchMode):
    """Records each op: index, name, module FQN, phase (forward/backward), source, digests."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[dict[str, Any]] = []
        self.module_stack: list[str] = []
        self._names: dict[int, str] = {}
        self._origin: dict[int, tuple[str | None, str | None]] = {}
        self._hooks: list[Any] = []

    # modules ------------------------------------------------------------------------------
    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if id(module) not in self._names:
            root = type(module).__name__
            for name, sub in module.named_modules():
                self._names.setdefault(id(sub), f"{root}.{name}" if name else root)
        self.module_stack.append(self._names[id(module)])

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.module_stack:
            self.module_stack.pop()

    def __enter__(self) -> OpRecorder:
        hooks = torch.nn.modules.module
        self._hooks = [hooks.register_module_forward_pre_hook(self._pre),
                       hooks.register_module_forward_hook(self._post)]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for handle in self._hooks:
            handle.remove()

    # ops ----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _digests((args, kwargs))
        out = func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        if node is None:
            phase, module, source = "forward", (self.module_stack[-1] if self.module_stack else None), _user_source()
        else:
            phase = "backward"
            module, source = self._origin.get(id(node), (None, None))
            module = f"{module} ({node.name()})" if module else node.name()
        name = str(func)
        outputs = None if _UNINITIALISED.search(name) else _digests(out)  # garbage memory is not a divergence
        self.ops.append({"i": len(self.ops), "op": name, "module": module, "phase": phase, "source": source,
                         "inputs": inputs, "outputs": outputs})
        if phase == "forward":
            for leaf in tree_flatten(out)[0]:
                grad_fn = getattr(leaf, "grad_fn", None) if isinstance(leaf, torch.Tensor) else None
                if grad_fn is not None:
                    self._origin[id(grad_fn)] = (module, source)
        return out


class StepReplay:
    """Records the ops of step ``step`` and then ends the process (the rest is not needed)."""

    def __init__(self, step: int, out: Path):
        self.step, self.out = step, Path(out)
        self.recorder: OpRecorder | None = None

    def start(self) -> None:
        self.recorder = OpRecorder()
        self.recorder.__enter__()

    def on_step_end(self, index: int) -> None:
        """Called by the step recorder after each optimizer step."""
        if index == self.step - 1:
            self.start()
        elif index == self.step and self.recorder is not None:
            self.recorder.__exit__(None, None, None)
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self.out.write_text(json.dumps({"step": self.step, "ops": self.recorder.ops}))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
