"""Run-to-run nondeterminism inside compiled code, localised in a replay of the divergent step.

Every inductor graph (forward and backward: inductor's inner compile is wrapped through
``compile_fx(..., inner_compile=...)``) runs as usual; each of its calls, from the first step on,
is recorded with digests of its inputs and outputs, so that two replays in two processes can be
compared graph call by graph call (the first call whose outputs differ on equal inputs names the
kernel whether or not a race recurs within one process). During the replayed step each call is
also run again on clones of the same inputs — repeated at the run's thread count and at one
thread — which is supporting evidence: a race that recurs in one process.
An output that differs on identical inputs is named: which gradient (the parameter, by name) or
activation it is, its FX node, the nondeterministic node behind it (a scatter with accumulation),
the inductor kernel that computes that node (found in inductor's generated code) with the aten
ops it fuses, and the user's source line.

Inductor internals are feature-detected; every patch is undone by :meth:`KernelRepeater.uninstall`.
Used only in replays (``torchrepro run --replay-step K --replay-kernels``).
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Callable
from typing import Any, TypedDict

import torch

from .._compat import compile_fx_module, current_compile_id, functorch_config, op_name, patch, wrap_compile_fx
from ..digests import fingerprint, hash_bytes
from ..eventlog.payloads import ExplainedOutput, KernelCall, KernelSummary, NodeInfo
from .fx_nodes import clean_fqn, first_line, leaves, node_info, same

# Extra calls per graph at the run's thread count: at least MIN_REPEATS, then more until an output
# differs, while the repeats have taken under REPEAT_BUDGET_S, up to MAX_REPEATS; then as many at one
# thread. A race between threads shows in only some calls (2 repeats of a small GPT's backward missed
# it in one replay of two on a quiet 2-core machine, in both under a loaded one), and a call that
# shows it ends the search at once.
MIN_REPEATS = 2
MAX_REPEATS = 32
REPEAT_BUDGET_S = 1.0
# aten ops whose CPU lowering in inductor accumulates with atomic adds (order depends on threads)
ACCUMULATING = (
    "index_put",
    "_unsafe_masked_index_put_accumulate",
    "index_add",
    "scatter_add",
    "scatter_reduce",
    "embedding_dense_backward",
    "_index_put_impl",
)


def _accumulates(node: Any) -> bool:
    name = op_name(node.target) or ""
    if not any(name.startswith(a) or name == a for a in ACCUMULATING):
        return False
    if name.startswith(("index_put", "_index_put_impl")):  # accumulate=True only
        acc = node.kwargs.get("accumulate", node.args[3] if len(node.args) > 3 else False)
        return bool(acc)
    return True


def _ancestors(node: Any) -> list[Any]:
    seen, order, todo = set(), [], [node]
    while todo:
        for parent in todo.pop().all_input_nodes:
            if parent.name not in seen:
                seen.add(parent.name)
                order.append(parent)
                todo.append(parent)
    return order


def _source_name(placeholder: Any) -> str:
    """``L['self']._modules['tok']._parameters['weight']`` → ``tok.weight`` (else the node name)."""
    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    name = getattr(source, "name", None)
    name = name() if callable(name) else name
    if not isinstance(name, str):
        return str(placeholder.name)
    name = re.sub(r"\._(?:parameters|buffers)\['([^']+)'\]", r".\1", name)
    return clean_fqn(name)


class AccumulatingNode(NodeInfo):
    """A node whose aten op accumulates with atomic adds (see :data:`ACCUMULATING`)."""

    aten: str  # the aten op it was lowered from: ``aten.index_put``


class DescribedOutput(NodeInfo):
    """An output of a compiled graph: its node, and the accumulating nodes it depends on (nearest first)."""

    accumulating: list[AccumulatingNode]


class GraphDescription(TypedDict):
    outputs: list[DescribedOutput | None]  # None: an output that is no node (a constant)
    ops: list[str]  # the graph's op names, sorted


class CompiledGraph(GraphDescription):
    """What describes one compiled graph: its outputs and ops, its inputs' names (a parameter's
    ``tok.weight``) and the code inductor generated for it (None when it has none)."""

    inputs: list[str]
    source_code: str | None


class CppKernel(TypedDict):
    signature: list[object]  # the argument types: ``const float*``, ...
    atomic_add: bool


class KernelName(TypedDict):
    kernel: str
    atomic_add: bool  # whether it accumulates with atomic adds
    fuses: list[str]  # the aten ops it fuses
    producers: list[str]  # the kernels behind the output, nearest first


def describe_outputs(gm: Any) -> GraphDescription:
    """Per output of an (aten-level) FX graph: its node, and the accumulating nodes it depends on."""
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = leaves(output.args[0])
    outs: list[DescribedOutput | None] = []
    for value in values:
        if not hasattr(value, "meta"):
            outs.append(None)
            continue
        chain = [value, *_ancestors(value)]
        culprits = [
            AccumulatingNode(**node_info(n), aten=_aten(n))
            for n in chain
            if n.op == "call_function" and _accumulates(n)
        ]
        outs.append(DescribedOutput(**node_info(value), accumulating=culprits[:3]))
    ops = set()
    for n in gm.graph.nodes:
        for t in (n.target, n.meta.get("original_aten")):
            name = op_name(t) if n.op == "call_function" or t is not n.target else None
            if name:
                ops.add(name)
    return {"outputs": outs, "ops": sorted(ops)}


def _aten(node: Any) -> str:
    original = node.meta.get("original_aten")
    return f"aten.{op_name(original)}" if original is not None and op_name(original) else f"aten.{op_name(node.target)}"


# --- inductor's generated wrapper code ---------------------------------------------------------

_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\((\[.*?\]), r'''(.*?)'''", re.S | re.M)
_NAME = re.compile(r"\b(buf\d+|[A-Za-z_]\w*)\b")


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _base(arg: str) -> str | None:
    m = re.match(r"(?:reinterpret_tensor\()?\s*([A-Za-z_]\w*)", arg)
    return m.group(1) if m else None


def kernels_of(source: str) -> dict[str, CppKernel]:
    """The C++ kernels defined in inductor's wrapper code: argument types and whether the body
    accumulates with atomic adds."""
    out: dict[str, CppKernel] = {}
    for name, types, body in _KERNEL_DEF.findall(source):
        try:
            signature = ast.literal_eval(types)
        except (ValueError, SyntaxError):
            signature = []
        out[name] = {"signature": signature, "atomic_add": "atomic_add" in body}
    return out


def accumulates(graph: CompiledGraph | None) -> bool:
    """Whether ``graph`` accumulates with atomic adds: an output depends on an accumulating aten op
    (:data:`ACCUMULATING`), or a kernel inductor generated for it adds atomically (C++ or Triton)."""
    if graph is None:
        return False
    source = graph["source_code"] or ""
    return any(o and o["accumulating"] for o in graph["outputs"]) or "atomic_add" in source


def producers(source: str, index: int) -> list[str]:
    """The kernels (and extern calls) that compute output ``index`` of the wrapper's ``call``,
    nearest first: a backward walk over the calls from the buffer it returns."""
    kernels = kernels_of(source)
    m = re.search(r"\n    def call\(self, args\):\n(.*?)\n        return \((.*?)\)\n", source, re.S)
    if m is None:
        return []
    body, returned = m.group(1).splitlines(), _split_args(m.group(2))
    if index >= len(returned) or _base(returned[index]) is None:
        return []
    wanted, found = {_base(returned[index])}, []
    for line in reversed(body):
        line = line.strip()
        if line.startswith("#") or not line:
            continue
        assign = re.match(r"(\w+) = (.*)$", line.split(";")[0])
        call = re.match(r"([\w.]+)\((.*)\)$", line)
        if assign:
            target, value = assign.groups()
            if target in wanted and not line.endswith("# reuse"):
                wanted.discard(target)
                wanted |= {n for n in _NAME.findall(value) if n.startswith("buf") or n in kernels}
                head = value.split("(")[0]
                if "(" in value and head not in ("reinterpret_tensor", "empty_strided_cpu"):
                    found.append(head)
            continue
        if call is None:
            continue
        name, args = call.groups()
        parts = _split_args(args)
        if name in kernels:
            sig = kernels[name]["signature"]
            written = {_base(a) for a, t in zip(parts, sig) if not str(t).startswith("const")}
        else:
            written = {_base(a.split("=", 1)[1]) for a in parts if a.startswith("out=")}
        if written & wanted:
            found.append(name)
            wanted |= {_base(a.split("=", 1)[-1]) for a in parts} - {None}
    return found


def fused_ops(kernel: str, ops: list[str]) -> list[str]:
    """``cpp_fused_add_embedding_dense_backward_sum_6`` → ``[add, embedding_dense_backward, sum]``
    (longest matches against the graph's op names)."""
    name = re.sub(r"_\d+$", "", re.sub(r"^cpp_fused_", "", kernel))
    out, p = [], 0
    while p < len(name):
        match = max(
            (o for o in ops if name.startswith(o, p) and (p + len(o) == len(name) or name[p + len(o)] == "_")),
            key=len,
            default=None,
        )
        if match is None:
            match = name[p:].split("_", 1)[0] or name[p:]
        out.append(match)
        p += len(match) + 1
    return out


def name_kernel(source: str | None, index: int, ops: list[str]) -> KernelName | None:
    """The kernel behind output ``index``: the nearest producer that accumulates with atomic adds,
    else the nearest producer; with the aten ops it fuses."""
    if not source:
        return None
    chain = producers(source, index)
    kernels = kernels_of(source)
    atomic = [k for k in chain if k in kernels and kernels[k]["atomic_add"]]
    nearest = atomic or chain
    if not nearest:
        return None
    kernel = nearest[0]
    return {
        "kernel": kernel,
        "atomic_add": bool(atomic),
        "fuses": fused_ops(kernel, ops) if kernel in kernels else [],
        "producers": chain[:6],
    }


# --- the repeater ------------------------------------------------------------------------------


def _digests(values: Any) -> list[str | None]:
    """Short digests of a graph call's inputs or outputs, flattened (None for what is no tensor;
    a Python scalar by its value)."""
    out: list[str | None] = []
    for x in leaves(values):
        if isinstance(x, torch.Tensor):
            out.append(fingerprint(x)[:16])
        else:
            out.append(repr(x) if isinstance(x, (int, float, bool)) else None)
    return out


def _copy(x: Any) -> Any:
    """A copy with the same sizes and strides (compiled graphs assert both)."""
    if not isinstance(x, torch.Tensor):
        return x
    out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x.detach())


def _lines(stack: str | None) -> bytes:
    """The line numbers and functions of a node's stack trace (not the files: the same script in
    another checkout, or a module a run imports from its own copy of the working directory, is
    served the same cached graphs; :func:`frame_files` lets a kept graph name this run's files)."""
    return repr(re.findall(r"line (\d+), in (\S+)", stack or "")).encode()


def frame_files(gm: Any) -> list[str]:
    """The file of every frame of every node's stack trace in ``gm``, in order (what :func:`_lines`
    leaves out)."""
    return [f for n in gm.graph.nodes for f in re.findall(r'File "(.+?)", line \d+', n.meta.get("stack_trace") or "")]


class KernelRepeater:
    """Wraps inductor's compile so every compiled forward and backward graph can be repeated."""

    def __init__(self) -> None:
        self.active = False  # during the replayed step: calls are repeated
        self.results: list[KernelCall] = []  # the replayed step's calls
        self.before: list[KernelCall] = []  # every call before it: digests only
        self.errors: list[str] = []  # what failed in the localisation itself (never the user's run)
        self._ours = False  # inside our own repeats
        self.graphs: dict[str, CompiledGraph] = {}  # "compile_id/forward" -> what describes it
        self._undo: list[Callable[[], None]] = []
        self.names: list[str] = []  # the inputs of the graph being compiled, as the script names them
        self.lines = ""  # a digest of its nodes' source lines (a cache key leaves them out)
        self.files: list[str] = []  # ... and the files of those lines
        # a cached AOTAutograd entry would skip inductor's inner compile: that cache is off unless a
        # subclass wraps the graphs loaded from it too (True)
        self.from_aot_cache = False

    def install(self) -> bool:
        """Patch inductor (feature-detected); False when this torch lacks what is needed."""
        module = compile_fx_module()
        if module is None:
            return False

        def compile_fx(original: Any, gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            if args or "inner_compile" in kwargs:
                return original(gm, example_inputs, *args, **kwargs)
            compile_id = str(current_compile_id())
            self.names = names = [_source_name(n) for n in gm.graph.nodes if n.op == "placeholder"]
            self.lines = hash_bytes(*(_lines(n.meta.get("stack_trace")) for n in gm.graph.nodes))
            self.files = frame_files(gm)
            inner = self._inner(compile_id, names, module.compile_fx_inner)
            return original(gm, example_inputs, inner_compile=inner, **kwargs)

        wrapped = wrap_compile_fx(compile_fx)
        if wrapped is None:
            return False
        self._undo.append(wrapped.undo)
        config = functorch_config()  # (the FX cache still serves)
        if not self.from_aot_cache and getattr(config, "enable_autograd_cache", None):
            self._undo.append(patch(config, "enable_autograd_cache", False).undo)
        return True

    def uninstall(self) -> None:
        """Undo every patch."""
        while self._undo:
            self._undo.pop()()

    def _inner(self, compile_id: str, names: list[str], inner: Any) -> Any:
        def inner_compile(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
            graph = "backward" if kwargs.get("is_backward") else "forward"
            described = self._describe(compile_id, graph, gm)  # before inductor's passes rewrite gm
            key = f"{compile_id}/{graph}"
            self._compiling(key, gm)
            compiled = inner(gm, example_inputs, *args, **kwargs)
            self._wrap_compiled(compiled, compile_id, graph, described, names)
            self._compiled(key, compiled)
            return compiled

        return inner_compile

    def _describe(self, compile_id: str, graph: str, gm: Any) -> GraphDescription:
        """:func:`describe_outputs` of ``gm``; empty where that fails (the compile goes on without it)."""
        try:
            return describe_outputs(gm)
        except Exception as exc:  # the description is ours
            self.errors.append(f"describing compiled graph {compile_id} ({graph}): {first_line(exc)}")
            return {"outputs": [], "ops": []}

    def _wrap_compiled(
        self, compiled: Any, compile_id: str, graph: str, described: GraphDescription, names: list[str]
    ) -> None:
        """Keep what describes inductor's output ``compiled`` and route its calls through :meth:`_wrap`."""
        self.graphs[f"{compile_id}/{graph}"] = CompiledGraph(
            **described, inputs=names, source_code=getattr(compiled, "source_code", None)
        )
        real = getattr(compiled, "current_callable", None)
        if callable(real):
            compiled.current_callable = self._wrap(real, compile_id, graph)

    def _compiling(self, key: str, gm: Any) -> None:
        """Called with each graph (``compile_id/forward``) before inductor compiles it (its passes
        may rewrite ``gm`` in place): nothing here; a subclass may keep a copy."""

    def _compiled(self, key: str, compiled: Any) -> None:
        """Called with inductor's output for each graph compiled (``key``: ``compile_id/forward``): nothing here."""

    def _wrap(self, real: Any, compile_id: str, graph: str) -> Any:
        def run(args: list[Any]) -> Any:
            if self._ours:
                return real(args)
            if not self.active:
                inputs = _digests(args)
                out = real(args)
                self.before.append(
                    {"compile_id": compile_id, "graph": graph, "inputs": inputs, "outputs": _digests(out)}
                )
                return out
            saved = [_copy(x) for x in args]
            out = real(args)
            self._ours = True  # the repeats below are ours
            try:
                self.results.append(self._repeat(real, saved, out, compile_id, graph))
            except Exception as exc:  # a failure of the repeat, not of the user's step: recorded
                self.errors.append(f"repeating compiled graph {compile_id} ({graph}): {first_line(exc)}")
                self.results.append(
                    {
                        "compile_id": compile_id,
                        "graph": graph,
                        "inputs": _digests(saved),
                        "outputs": _digests(out),
                        "error": first_line(exc),
                    }
                )
            finally:
                self._ours = False
            return out

        return run

    def _repeat(self, real: Any, saved: list[Any], out: Any, compile_id: str, graph: str) -> KernelCall:
        outs = leaves(out)
        rng = torch.random.get_rng_state()
        threads = torch.get_num_threads()

        def again() -> list[Any]:
            torch.random.set_rng_state(rng)
            return leaves(real([_copy(x) for x in saved]))

        def differing(a: list[Any], b: list[Any]) -> dict[int, float | None]:
            return {i: d for i, (x, y) in enumerate(zip(a, b)) for equal, d in [same(x, y)] if not equal}

        repeats: dict[int, float | None] = {}
        count, start = 0, time.perf_counter()
        while count < MIN_REPEATS or (
            not repeats and count < MAX_REPEATS and time.perf_counter() - start < REPEAT_BUDGET_S
        ):
            repeats |= differing(outs, again())
            count += 1
        one_thread: dict[int, float | None] = {}
        if threads > 1:
            torch.set_num_threads(1)
            try:
                first = again()
                for _ in range(count):
                    one_thread |= differing(first, again())
            finally:
                torch.set_num_threads(threads)
        torch.random.set_rng_state(rng)
        return {
            "compile_id": compile_id,
            "graph": graph,
            "threads": threads,
            "repeats": count,
            "inputs": _digests(saved),
            "outputs": _digests(outs),
            "repeat_differs": {str(i): d for i, d in sorted(repeats.items())},
            "one_thread_differs": {str(i): d for i, d in sorted(one_thread.items())} if threads > 1 else None,
        }

    def explain(self, compile_id: str, graph: str, index: int) -> ExplainedOutput:
        """What output ``index`` of a compiled graph is: parameter gradient or activation, FX node,
        accumulating node, kernel and source line."""
        info = self.graphs.get(f"{compile_id}/{graph}")
        outputs = info["outputs"] if info else []
        names = info["inputs"] if info else []
        node = outputs[index] if index < len(outputs) else None
        out: ExplainedOutput = {"compile_id": compile_id, "graph": graph, "output_index": index}
        if graph == "backward" and len(outputs) == len(names) and index < len(names):
            out["parameter"] = names[index]  # the backward returns one gradient per forward input
        if node:
            out["node"] = node["node"]
            module = f", {node['module']}" if node.get("module") else ""
            out["output"] = f"{node['node']} ({node['target']}{module})"
            culprit = node["accumulating"][0] if node["accumulating"] else None
            origin: NodeInfo = culprit or node
            out["op"] = culprit["aten"] if culprit else f"aten.{node['target']}"
            out["source"] = origin.get("source")
            out["module"] = origin.get("module") or (
                out["parameter"].rsplit(".", 1)[0] if "." in out.get("parameter", "") else None
            )
            if culprit:
                out["accumulating_node"] = culprit["node"]
        kernel = name_kernel(info["source_code"], index, info["ops"]) if info else None
        if kernel:
            out["kernel"] = kernel["kernel"]
            out["kernel_fuses"] = [f"aten.{o}" for o in kernel["fuses"]]
            out["kernel_atomic_add"] = kernel["atomic_add"]
        return out

    def summary(self) -> KernelSummary:
        """The calls with their digests and repeat results, and every output of every graph called,
        explained (so that replays in two processes can be compared afterwards)."""
        called = sorted({(r["compile_id"], r["graph"]) for r in self.results + self.before})
        explained: dict[str, list[ExplainedOutput]] = {}
        for c, g in called:
            try:
                described = self.graphs.get(f"{c}/{g}")
                count = len(described["outputs"]) if described else 0
                explained[f"{c}/{g}"] = [self.explain(c, g, i) for i in range(count)]
            except Exception as exc:  # naming is ours: the digests still compare
                self.errors.append(f"explaining compiled graph {c} ({g}): {first_line(exc)}")
        return {"calls": self.results, "before": self.before, "explained": explained, "errors": self.errors}
