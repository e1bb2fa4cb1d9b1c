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
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from .._compat import (
    current_autograd_node,
    current_compile_id,
    dispatch_mode,
    keep_boxed_call,
    ops_replay,
    tree_flatten,
    wrap_compile_fx,
)
from ..digests import fingerprint
from .. import _state
from .._dist import placement
from ..eventlog.payloads import GraphCheck, OpRecord, Replay
from ..eventlog.random_ops import is_random_op
from ..eventlog.rundir import replay_file
from .fx_nodes import SKIP_DIRS, first_line, leaves, node_info, same, target_name

_UNINITIALISED = re.compile(r"\bempty|_empty")


Flatten = Callable[[Any], tuple[list[Any], Any]]  # torch's tree_flatten: (leaves, spec)


def _digests(flatten: Flatten, values: Any) -> list[str | None]:
    leaves, _ = flatten(values)
    return [fingerprint(v)[:16] if isinstance(v, torch.Tensor) else None for v in leaves if isinstance(v, torch.Tensor)]


def _user_source() -> str | None:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(SKIP_DIRS) and not filename.startswith("<"):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


# the base is the probe's class (torch's TorchDispatchMode) or object, known at run time only: unchecked
class OpRecorder(dispatch_mode() or object):  # type: ignore[misc]
    """Records each op: index, name, module FQN, phase (forward/backward), source, digests
    (only where :func:`~torchrepro._compat.ops_replay` says this torch has what it needs)."""

    def __init__(self, unrecorded: Callable[[], bool] = lambda: False) -> None:
        super().__init__()
        self._unrecorded = unrecorded  # true while capture does its own tensor work (fingerprints, norms, checks)
        flatten, autograd_node = tree_flatten(), current_autograd_node()
        if flatten is None or autograd_node is None:
            raise RuntimeError("this torch cannot replay ops (torchrepro._compat.ops_replay)")
        self._flatten: Flatten = flatten
        self._autograd_node: Callable[[], Any] = autograd_node
        self.ops: list[OpRecord] = []
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
        self._hooks = [
            hooks.register_module_forward_pre_hook(self._pre),
            hooks.register_module_forward_hook(self._post),
        ]
        entered: OpRecorder = super().__enter__()  # torch's mode, entered
        return entered

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for handle in self._hooks:
            handle.remove()

    # ops ----------------------------------------------------------------------------------
    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if self._unrecorded():
            return func(*args, **kwargs)
        inputs = _digests(self._flatten, (args, kwargs))
        out = func(*args, **kwargs)
        node = self._autograd_node()
        if node is None:
            phase, module, source = "forward", (self.module_stack[-1] if self.module_stack else None), _user_source()
        else:
            phase = "backward"
            module, source = self._origin.get(id(node), (None, None))
            module = f"{module} ({node.name()})" if module else node.name()
        name = str(func)
        # garbage memory is not a divergence (nor views of it: a view holds no data of its own, what made
        # or writes its memory is compared); nor are a collective's buffers, still being filled when it returns
        skip = _UNINITIALISED.search(name) or name.startswith("c10d.") or getattr(func, "is_view", False)
        outputs = None if skip else _digests(self._flatten, out)
        self.ops.append(
            {
                "i": len(self.ops),
                "op": name,
                "module": module,
                "phase": phase,
                "source": source,
                "inputs": inputs,
                "outputs": outputs,
            }
        )
        if phase == "forward":
            for leaf in self._flatten(out)[0]:
                grad_fn = getattr(leaf, "grad_fn", None) if isinstance(leaf, torch.Tensor) else None
                if grad_fn is not None:
                    self._origin[id(grad_fn)] = (module, source)
        return out


class GraphChecker:
    """In a compiled replay: every inductor-compiled graph called during the replayed step is
    run a second time as its plain FX graph (eager aten ops) on the same inputs, from the same
    RNG state, and its outputs are compared with the compiled ones."""

    def __init__(self) -> None:
        self.active = False
        self.results: list[GraphCheck] = []
        self._patch: Any = None

    def install(self) -> bool:
        """Wrap inductor's entry point; False when this torch lacks it."""
        import copy

        def compile_fx(original: Any, gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            reference = copy.deepcopy(gm)  # inductor's passes may rewrite gm in place
            compiled = original(gm, example_inputs, *args, **kwargs)
            return self._wrap(compiled, reference, str(current_compile_id()))

        self._patch = wrap_compile_fx(compile_fx)
        return self._patch is not None

    def uninstall(self) -> None:
        """Put inductor's entry point back."""
        if self._patch is not None:
            self._patch.undo()

    def _wrap(self, compiled: Any, reference: Any, compile_id: str) -> Any:
        def run(*args: Any) -> Any:
            boxed = len(args) == 1 and isinstance(args[0], list)  # boxed calling convention: one list
            inputs = list(args[0]) if boxed else list(args)
            if not self.active:
                return compiled(*args)
            saved = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            before = torch.random.get_rng_state()
            out = compiled(*args)
            after = torch.random.get_rng_state()
            torch.random.set_rng_state(before)
            with torch.no_grad():
                expected = reference(*saved)
            torch.random.set_rng_state(after)
            try:
                self._compare(compile_id, reference, out, expected)
            except Exception as exc:  # the localisation's failure, not the user's: reported as such
                self.results.append({"compile_id": compile_id, "error": first_line(exc)})
            return out

        return keep_boxed_call(run, compiled)

    def _compare(self, compile_id: str, reference: Any, out: Any, expected: Any) -> None:
        outputs, wanted = leaves(out), leaves(expected)
        nodes = leaves([n for n in reference.graph.nodes if n.op == "output"][0].args[0])
        random = [
            node_info(n)
            for n in reference.graph.nodes
            if n.op in ("call_function", "call_method", "call_module") and is_random_op(f"x.{target_name(n)}")
        ]
        entry: GraphCheck = {"compile_id": compile_id, "outputs": len(outputs), "random_nodes": random[:5]}
        for i, (x, y) in enumerate(zip(outputs, wanted)):
            equal, diff = same(x, y)
            if not equal:
                node = nodes[i] if i < len(nodes) and hasattr(nodes[i], "meta") else None
                entry["first_differing_output"], entry["max_abs"] = i, diff
                if node is not None:
                    info = node_info(node)
                    entry["node"], entry["target"] = info["node"], info["target"]
                    entry["module"], entry["source"] = info["module"], info["source"]
                    ancestors = _ancestors(node)
                    entry["depends_on_random"] = [r for r in random if r["node"] in ancestors]
                break
        self.results.append(entry)


def _ancestors(node: Any) -> set[str]:
    seen: set[str] = set()
    todo = [node]
    while todo:
        for parent in todo.pop().all_input_nodes:
            if parent.name not in seen:
                seen.add(parent.name)
                todo.append(parent)
    return seen


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _wait_for_child_ranks(timeout: float = 120.0) -> None:
    """Before this process ends itself early (a replay's ``os._exit``): wait, up to ``timeout`` s,
    for the ranks of its capture's run that are its own children (Lightning starts ranks 1.. below
    rank 0), which the launcher would otherwise stop before they finish the same step."""
    import time

    from ..eventlog.event_reader import rank_logs, read_header

    session = _state.session()
    if session is None or session.pid != os.getpid():
        return
    headers = (read_header(log) for log in rank_logs(session.run_dir))
    children = [h.pid for h in headers if h is not None and h.pid and _parent(h.pid) == os.getpid()]
    deadline = time.monotonic() + timeout
    for pid in children:
        try:
            while not os.waitpid(pid, os.WNOHANG)[0] and time.monotonic() < deadline:
                time.sleep(0.05)
        except ChildProcessError:  # already reaped
            continue


class StepReplay:
    """Records step ``step`` — every op (eager replay) or every compiled graph against its eager
    FX graph (compiled replay) — and then ends the process (the rest is not needed). Where this
    torch lacks what a compiled replay needs, the ops are recorded; where it lacks what that
    needs, nothing is (the ``torch_api`` capability events say which API was missing)."""

    def __init__(
        self,
        step: int,
        out: Path,
        graphs: bool = False,
        kernels: bool = False,
        unrecorded: Callable[[], bool] = lambda: False,
    ):
        """``unrecorded``: whether an op now is capture's own (not recorded)."""
        self.step, self.out = step, Path(out)
        self._unrecorded = unrecorded
        self.recorder: OpRecorder | None = None
        self.checker: GraphChecker | None = None
        self.repeater = None
        if kernels:
            from .kernels import KernelRepeater

            self.repeater = KernelRepeater()
            if not self.repeater.install():
                self.repeater = None
        elif graphs:
            self.checker = GraphChecker()
            if not self.checker.install():
                self.checker = None

    def start(self) -> None:
        if self.repeater is not None:
            self.repeater.active = True
        elif self.checker is not None:
            self.checker.active = True
        elif ops_replay():
            self.recorder = OpRecorder(self._unrecorded)
            self.recorder.__enter__()

    def on_step_end(self, index: int) -> None:
        """Called by the step recorder after each optimizer step."""
        if index == self.step - 1:
            self.start()
        elif index == self.step:
            result: Replay = {"step": self.step}
            if self.recorder is not None:
                self.recorder.__exit__(None, None, None)
                result["ops"] = self.recorder.ops
            if self.checker is not None:
                result["graphs"] = self.checker.results
                self.checker.uninstall()
            if self.repeater is not None:
                self.repeater.active = False
                result["kernels"] = self.repeater.summary()
                self.repeater.uninstall()
            here = placement()  # the group's rank once joined (a rank Lightning started did not know it at start)
            out = replay_file(self.out, here.rank, here.world_size)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result))
            _wait_for_child_ranks()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
