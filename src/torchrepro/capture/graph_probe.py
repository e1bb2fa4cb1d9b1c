"""Probe every compiled graph for nondeterminism directly, in the run itself.

Two whole runs that happen to agree do not show a race between threads that shows in only some
calls. Here each inductor graph (forward and backward) keeps a copy of the inputs of its first
call, the RNG state it started from and digests of what it returned; after the step it ran in
(the step recorder's listener, so outside the step's own time), it is called again
``repeats`` times on fresh copies of those inputs (fewer once one differs), in this process at this
thread count, and every output is compared bit for bit with the first call's. A graph whose outputs differ is written as
a :class:`~torchrepro.eventlog.events.GraphProbe` event, explained as the kernel replay explains
one (:meth:`~torchrepro.capture.kernels.KernelRepeater.explain`: parameter, FX node, op, kernel,
source line).

Observation does not perturb the run: the repeats run on copies (a graph that writes into its
inputs writes into the copies), without autograd, from the RNG state of the first call, and the
RNG state of the moment is put back afterwards; the run's parameters and outputs are untouched.
The copies are dropped once probed. Used by ``check`` (every run) and ``doctor --probe``.
"""

from __future__ import annotations

import json
import math
import operator
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..eventlog.events import PROBE_MISS, CacheLookup, Event, GraphProbe, GraphsRan
from ..eventlog.output_guard import output_folder
from ..eventlog.rundir import atomic_path
from ..eventlog.payloads import NodeInfo
from .fx_nodes import first_line, leaves, node_info, same
from .._compat import aot_cache_loading, current_compile_id, functorch_config, op_name, patch
from .kernels import GraphDescription, KernelRepeater, _copy, _digests, accumulates
from .repro_script import GRAPH_CODE, GRAPH_INPUTS, GRAPH_META, MAX_SAVED_BYTES, TENSOR_FILES, safetensors_bytes


MIN_REPEATS = 2  # a graph that differs stops being repeated after this many
# A graph that accumulates with atomic adds at several threads races only when its threads run at
# the same moment, which a busy machine makes rare: such a graph that has repeated bit for bit is
# called on, up to this many times the repeats asked for, while the time these extra calls took
# in the whole run stays under this share of the run's time so far.
ACCUMULATING_FACTOR = 8
ACCUMULATING_SHARE = 0.1


@dataclass
class _Call:
    """The first call of one compiled graph: the callable, copies of its inputs, the RNG state it
    started from and its outputs' digests."""

    compile_id: str
    graph: str
    real: Callable[[list[Any]], Any]
    inputs: list[Any]
    rng: torch.Tensor
    digests: list[str | None]


class GraphProber(KernelRepeater):
    """Keeps the first call of each compiled graph and calls it again after the step (see the
    module); with ``save_to``, each probed graph's FX code and inputs are saved there for
    ``torchrepro repro`` (:func:`save_graph`); with ``against_eager``, each graph's outputs are
    also compared with its FX graph run eagerly (``check --against``: where in backward compiled
    and eager part), else the FX graph runs eagerly only to name the node of a graph that differs."""

    def __init__(
        self, emit: Callable[[Event], None], repeats: int, save_to: Path | None = None, against_eager: bool = False
    ) -> None:
        super().__init__()
        self.emit, self.repeats, self.save_to, self.against_eager = emit, repeats, save_to, against_eager
        self.pending: dict[str, _Call] = {}  # "compile_id/graph" -> its first call, not probed yet
        self.seen: set[str] = set()
        self.fx: dict[str, Any] = {}  # "compile_id/graph" -> its aten FX graph, as inductor was given it
        self.started, self.extra_s = time.perf_counter(), 0.0  # the extra calls' time (ACCUMULATING_SHARE)
        self.ran: dict[str, None] = {}  # the graphs this step called, in the order first called
        self.ran_before: list[str] = []  # ... and those the last GraphsRan event named
        self.missed = False  # an AOTAutograd cache hit made a miss, its lookup not recorded yet

    def install(self) -> bool:
        self.from_aot_cache = self._load_from_aot_cache()
        return super().install()

    def mark_miss(self, lookup: CacheLookup) -> None:
        """Say of the AOTAutograd miss the probe made (torch records the lookup right after) that it is
        the probe's doing, not the cache's (:data:`~torchrepro.eventlog.events.PROBE_MISS`)."""
        if self.missed and lookup.cache == "aotautograd" and lookup.status == "miss":
            lookup.reason, self.missed = PROBE_MISS, False

    def _compiling(self, key: str, gm: Any) -> None:
        import copy

        try:
            self.fx[key] = copy.deepcopy(gm)  # inductor's passes rewrite gm in place
        except Exception as exc:  # the node-level naming is lost, the probe still runs
            self.errors.append(f"copying compiled graph {key}: {first_line(exc)}")

    def _compiled(self, key: str, compiled: Any) -> None:
        """Keep the graph beside inductor's cache entry, for a later run served from the
        AOTAutograd cache (:meth:`_load_from_aot_cache`)."""
        found, gm = aot_cache_loading(), self.fx.get(key)
        fx_key = getattr(compiled, "_fx_graph_cache_key", None)
        if not self.from_aot_cache or found is None or gm is None or not isinstance(fx_key, str):
            return
        _, _, cache_dir, pickling, _ = found
        try:
            store_graph(self._kept_at(cache_dir, fx_key), gm, self.graphs.get(key), pickling, self.files)
        except Exception as exc:  # the next run compiles this graph again; this one is probed all the same
            self.errors.append(f"keeping compiled graph {key} beside the cache: {first_line(exc)}")

    def _kept_at(self, cache_dir: Callable[[], str], fx_key: str) -> Path:
        """Where the FX graph of ``fx_key`` is kept, traced from the source lines of the graph being
        compiled: an edit that moves them (not in the cache's key) finds none, and compiles again."""
        return Path(cache_dir()) / STORED_GRAPHS / f"{fx_key}-{self.lines[:16]}"

    def _load_from_aot_cache(self) -> bool:
        """Wrap the graphs an AOTAutograd cache entry loads (that cache then stays on: tracing
        again costs a run seconds), each with its FX graph kept by the run that compiled it; an
        entry none was kept for counts as a miss and is compiled, through inner compile, again.
        False where this torch lacks what that takes, or bundles the entries."""
        found, config = aot_cache_loading(), functorch_config()
        if found is None or getattr(config, "bundled_autograd_cache", False):
            return False
        loadable, miss, cache_dir, pickling, fake_mode = found
        original: Any = getattr(loadable, "load")

        def load(entry: Any, example_inputs: Any) -> Any:
            graph = "backward" if entry._is_backward() else "forward"
            fx_key = str(entry.fx_graph_cache_info[0])
            kept = load_graph(self._kept_at(cache_dir, fx_key), pickling, fake_mode, self.files)
            if kept is None:
                self.missed = True  # the lookup this miss ends is said to be the probe's (mark_miss)
                raise miss(f"torchrepro keeps no FX graph for {fx_key}")
            compiled = original(entry, example_inputs)
            compile_id = str(current_compile_id())
            self.fx[f"{compile_id}/{graph}"], described = kept
            self._wrap_compiled(compiled, compile_id, graph, described, self.names)
            return compiled

        self._undo.append(patch(loadable, "load", load).undo)
        return True

    def _wrap(self, real: Any, compile_id: str, graph: str) -> Any:
        key = f"{compile_id}/{graph}"

        def run(args: list[Any]) -> Any:
            self.ran[key] = None
            if self._ours or key in self.seen:
                return real(args)
            self.seen.add(key)
            try:
                saved = [_copy(x) for x in args]
                rng = torch.random.get_rng_state()
            except Exception as exc:  # the probe's own failure (memory): the call goes on unprobed
                self.emit(GraphProbe(compile_id=compile_id, graph=graph, error=first_line(exc)))
                return real(args)
            out = real(args)
            self.pending[key] = _Call(compile_id, graph, real, saved, rng, _digests(out))
            return out

        return run

    def on_step_end(self, index: int) -> None:
        """The step recorder's listener: say which graphs the step called where they are not those of
        the step before (:class:`GraphsRan`), and probe every graph first called since the last step."""
        ran, self.ran = list(self.ran), {}
        if index >= 0 and ran != self.ran_before:
            self.ran_before = ran
            self.emit(GraphsRan(step=index, graphs=ran))
        while self.pending:
            _, call = self.pending.popitem()
            event = self.probe(call)
            event.step = index if index >= 0 else None
            gm = self.fx.get(f"{call.compile_id}/{call.graph}")
            if self.save_to is not None and gm is not None:
                try:
                    save_graph(self.save_to / graph_dir_name(call.compile_id, call.graph), gm, call, event)
                except Exception as exc:  # the reproducer is lost, never the run
                    event.not_saved = first_line(exc)
            self.emit(event)

    def _against_eager(self, event: GraphProbe, gm: Any, call: _Call, compiled: list[Any], eager: list[Any]) -> None:
        """The compiled outputs against the same FX graph run eagerly (what aot_eager runs): the
        outputs that differ, and the first of them in the graph's own order (in a backward graph,
        the gradient computed first), with its node, op and source line."""
        diffs = {i: d for i, (x, y) in enumerate(zip(compiled, eager)) for equal, d in [same(x, y)] if not equal}
        event.eager_differing = sorted(diffs)
        if not diffs:
            return
        output = next(n for n in gm.graph.nodes if n.op == "output")
        produced = leaves(output.args[0])
        order = {n.name: i for i, n in enumerate(gm.graph.nodes)}

        def position(i: int) -> int:
            node = produced[i] if i < len(produced) else None
            return order.get(getattr(node, "name", ""), len(order))

        index = min(diffs, key=position)
        explained: dict[str, Any] = dict(self.explain(call.compile_id, call.graph, index))
        node: Any = produced[index] if index < len(produced) else None
        if hasattr(node, "meta"):
            info = node_info(node)
            computed = node  # through views and getitem to the op that computed the value
            while (computed.target is operator.getitem or getattr(computed.target, "is_view", False)) and hasattr(
                computed.args[0], "target"
            ):
                computed = computed.args[0]
            explained.update(node=info["node"], op=str(computed.target), source=info["source"], module=info["module"])
        explained["max_abs"] = diffs[index]
        event.eager_explained = explained

    def probe(self, call: _Call) -> GraphProbe:
        """Call ``call`` again :attr:`repeats` times on copies of its inputs (more where it
        accumulates with atomic adds at several threads: :data:`ACCUMULATING_FACTOR`); what differed."""
        key = f"{call.compile_id}/{call.graph}"
        event = GraphProbe(compile_id=call.compile_id, graph=call.graph, threads=torch.get_num_threads())
        event.accumulates = event.threads > 1 and accumulates(self.graphs.get(key))
        state = torch.random.get_rng_state()
        start = time.perf_counter()
        self._ours = True
        try:
            first: list[Any] | None = None
            differing: set[int] = set()
            runs_differing, largest = 0, None
            with torch.no_grad():
                for n in range(self.repeats * (ACCUMULATING_FACTOR if event.accumulates else 1)):
                    if n >= self.repeats and self.extra_s > ACCUMULATING_SHARE * (time.perf_counter() - self.started):
                        break
                    called = time.perf_counter()
                    outs = _again(call)
                    self.extra_s += time.perf_counter() - called if n >= self.repeats else 0.0
                    digests = _digests(outs)
                    now = {i for i, (a, b) in enumerate(zip(digests, call.digests)) if a != b}
                    if first is None:
                        first = outs
                    else:
                        for i, (x, y) in enumerate(zip(first, outs)):
                            equal, diff = same(x, y)
                            if not equal:
                                now.add(i)
                                largest = diff if largest is None or (diff or 0) > largest else largest
                    runs_differing += bool(now)
                    differing |= now
                    event.repeats += 1
                    if differing and event.repeats >= MIN_REPEATS:  # shown: more repeats say nothing more
                        break
            event.runs_differing, event.differing, event.max_abs = runs_differing, sorted(differing), largest
            if differing and event.threads > 1:
                event.one_thread = _one_thread(call, event.repeats)
            gm = self.fx.get(key)
            eager = interpret(gm, call) if gm is not None and (differing or self.against_eager) else None
            if self.against_eager and gm is not None and eager is not None and first is not None:
                self._against_eager(event, gm, call, first, eager[0])
            if differing:
                explained: dict[str, Any] = dict(self.explain(call.compile_id, call.graph, min(differing)))
                node = first_differing_node(gm, call, eager[1]) if gm is not None and eager is not None else None
                if node is not None:  # the FX graph run eagerly shows where: that node names it
                    explained.update(eager_node=node["node"], op=node["op"], source=node["source"])
                    # a backward node carries no module: the parameter's owner (explain's) is kept then
                    explained["module"] = node["module"] or explained.get("module")
                event.explained = explained
        except Exception as exc:  # the probe's own failure: said in the event, the run goes on
            event.error = first_line(exc)
        finally:
            self._ours = False
            torch.random.set_rng_state(state)
            event.time_s = round(time.perf_counter() - start, 6)
        return event


def _again(call: _Call) -> list[Any]:
    """``call``'s graph called once more on fresh copies of its inputs, from its RNG state."""
    torch.random.set_rng_state(call.rng)
    return leaves(call.real([_copy(x) for x in call.inputs]))


def _one_thread(call: _Call, repeats: int) -> str:
    """Whether ``call``'s graph at one intra-op thread ``differs`` or ``repeats bit for bit`` over
    ``repeats`` more calls (a race between threads does not happen with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = _again(call)
        return "differs" if any(not same(first, _again(call))[0] for _ in range(repeats)) else "repeats bit for bit"
    finally:
        torch.set_num_threads(threads)


EAGER_TRIES = 4  # eager interpretations of a differing graph compared node by node


def interpret(gm: Any, call: _Call) -> tuple[list[Any], dict[str, list[str | None]]]:
    """``gm`` (the aten FX graph the compiled one was made from) run eagerly, node by node, on copies
    of ``call``'s inputs from its RNG state: its outputs, and each node's output digests by name."""
    import torch.fx

    seen: dict[str, list[str | None]] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n.op == "call_function":
                seen[n.name] = _digests(leaves(out))
            return out

    torch.random.set_rng_state(call.rng)
    with torch.no_grad():
        out = Recorder(gm).run(*[_copy(x) for x in call.inputs])
    return leaves(out), seen


class DifferingNode(NodeInfo):
    """A node whose value differs between eager interpretations, and its aten op: the one it was
    decomposed from where it was (``aten.embedding_dense_backward``), else its own, qualified."""

    op: str


def first_differing_node(gm: Any, call: _Call, first: dict[str, list[str | None]]) -> DifferingNode | None:
    """The first node of ``gm`` whose value in eager interpretations (:func:`interpret`; ``first``:
    one already made) is not bit for bit the same as in ``first`` (up to :data:`EAGER_TRIES` more:
    a race shows in only some), or None."""
    for _ in range(EAGER_TRIES):
        _, again = interpret(gm, call)
        for n in gm.graph.nodes:
            if n.name in first and first[n.name] != again.get(n.name):
                original = n.meta.get("original_aten")
                aten = getattr(original, "namespace", None) == "aten" and op_name(original)
                op = f"aten.{op_name(original)}" if aten else str(original or n.target)
                return DifferingNode(**node_info(n), op=op)
    return None


# in inductor's cache folder: each FX graph a probed run compiled (a new format, a new folder: graphs
# kept by an earlier torchrepro, without their source files, are compiled again)
STORED_GRAPHS = "torchrepro-graphs-2"


def store_graph(path: Path, gm: Any, described: GraphDescription | None, pickling: Any, files: list[str]) -> None:
    """Keep ``gm`` (``path.graph``, torch's GraphPickler: node metadata but the module stacks) and
    what describes it, its nodes' modules and the source files of the graph compiled
    (``files``: :func:`~.kernels.frame_files`) in ``path.json``, for :func:`load_graph`."""
    if path.with_suffix(".json").exists():
        return
    innermost = {
        n.name: list(n.meta["nn_module_stack"].values())[-1] for n in gm.graph.nodes if n.meta.get("nn_module_stack")
    }
    stacks = {name: [fqn, getattr(cls, "__name__", str(cls))] for name, (fqn, cls) in innermost.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path.with_suffix(".graph")) as tmp:  # every op by name (prims.iota included)
        tmp.write_bytes(pickling.GraphPickler.dumps(gm, pickling.Options(ops_filter=None)))
    description = {k: v for k, v in (described or {}).items() if k in ("outputs", "ops")}
    with atomic_path(path.with_suffix(".json")) as tmp:  # written last: the pair is complete
        tmp.write_text(json.dumps({"described": description, "modules": stacks, "files": files}), encoding="utf-8")


def _moves(kept: list[str], now: list[str]) -> dict[str, str]:
    """Each source file of a kept graph that the graph compiled now has elsewhere (the same frames,
    file for file); none where the two do not pair up one to one.

    >>> _moves(["/a/train.py", "/a/train.py", "/a/model.py"], ["/b/train.py", "/b/train.py", "/a/model.py"])
    {'/a/train.py': '/b/train.py'}
    """
    pairs: dict[str, str] = {}
    if len(kept) != len(now) or any(pairs.setdefault(old, new) != new for old, new in zip(kept, now)):
        return {}
    return {old: new for old, new in pairs.items() if old != new}


def _relocate(gm: Any, described: GraphDescription, moves: dict[str, str]) -> None:
    """Point the stack traces of ``gm``'s nodes and the source lines of ``described`` at ``moves``' files."""

    def moved(source: str | None) -> str | None:
        file, colon, line = (source or "").rpartition(":")
        return f"{moves[file]}{colon}{line}" if file in moves else source

    for n in gm.graph.nodes:
        if n.meta.get("stack_trace"):
            n.meta["stack_trace"] = re.sub(
                r'File "(.+?)"', lambda m: f'File "{moves.get(m[1], m[1])}"', n.meta["stack_trace"]
            )
    for out in described["outputs"]:
        for info in [out, *out["accumulating"]] if out else []:
            info["source"] = moved(info.get("source"))


def load_graph(path: Path, pickling: Any, fake_mode: Any, files: list[str]) -> tuple[Any, GraphDescription] | None:
    """The FX graph (its tensors fake, in a new ``fake_mode()``) and description :func:`store_graph`
    kept at ``path``, their source lines in ``files`` (those of the graph compiled now, where its
    script or modules lie elsewhere than the kept graph's); None where none is kept (or unreadable)."""
    try:
        kept = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
        gm = pickling.GraphPickler.loads(path.with_suffix(".graph").read_bytes(), fake_mode())
    except Exception:  # none kept, or not readable by this torch: compiled again
        return None
    for n in gm.graph.nodes:
        if n.name in kept["modules"]:
            n.meta["nn_module_stack"] = {n.name: tuple(kept["modules"][n.name])}
    described: GraphDescription = {"outputs": [], "ops": [], **kept["described"]}
    _relocate(gm, described, _moves(kept.get("files", []), files))
    return gm, described


GRAPHS_DIR = "graphs"  # in each rank's folder: one folder a compiled graph (graph_dir_name)


def graph_dir_name(compile_id: str, graph: str) -> str:
    """``0/1`` backward → ``0_1-backward``: the folder one compiled graph is saved in."""
    return f"{compile_id.replace('/', '_')}-{graph}"


def _global_line(name: str, value: Any) -> str:
    """One line of Python that binds ``name`` as the FX code's globals do (``torch``, ``inf``, ``device``)."""
    if isinstance(value, type(math)):
        return f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}"
    if value is type(None):
        return f"{name} = type(None)"
    if isinstance(value, float):
        return f"{name} = float({str(value)!r})"
    if value is None or isinstance(value, (str, int, bool)):
        return f"{name} = {value!r}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        head, *rest = qualname.split(".")
        return (
            f"from {module} import {head} as {name}"
            if not rest
            else f"from {module} import {head} as _{name}; {name} = _{name}.{'.'.join(rest)}"
        )
    raise ValueError(f"the FX code's global {name} ({type(value).__name__}) cannot be written as Python")


def graph_source(gm: Any) -> str:
    """``gm`` as a standalone Python module: a ``Graph(torch.nn.Module)`` whose ``forward`` is the
    FX code (its parameters are its inputs; constants it reads are set on it by the loader)."""
    code = gm.graph.python_code(root_module="self")
    lines = ["import torch", *sorted({_global_line(n, v) for n, v in code.globals.items() if n != "torch"})]
    body = "\n".join("    " + line if line.strip() else "" for line in code.src.strip("\n").splitlines())
    return "\n".join([*lines, "", "", "class Graph(torch.nn.Module):", body, ""])


def save_graph(directory: Path, gm: Any, call: _Call, event: GraphProbe) -> None:
    """Save one compiled graph for ``torchrepro repro`` into the new folder ``directory``: its FX
    code (:func:`graph_source`), its first call's inputs and the constants it reads
    (``inputs.safetensors``: plain tensors, :func:`~.repro_script.safetensors_bytes`), how to
    rebuild each input (sizes, strides, dtype; a Python number by value) and what the probe found:
    the files :func:`~.repro_script.parse` reads back. Each file is created fresh (never through a
    link, never onto an existing file: :func:`~torchrepro.eventlog.output_guard.output_folder`).
    Nothing is saved when the tensors take more than :data:`~.repro_script.MAX_SAVED_BYTES`."""
    tensors: dict[str, torch.Tensor] = {}
    inputs: list[dict[str, Any]] = []
    for i, x in enumerate(call.inputs):
        if isinstance(x, torch.Tensor):
            key = f"input_{i}"
            tensors[key] = x.detach().cpu().contiguous().clone()
            inputs.append(
                {
                    "kind": "tensor",
                    "key": key,
                    "size": list(x.shape),
                    "stride": list(x.stride()),
                    "device": str(x.device),
                }
            )
        elif x is None or isinstance(x, (bool, int, float)):
            inputs.append({"kind": "value", "value": x})
        else:
            raise ValueError(f"input {i} is a {type(x).__name__}, which cannot be saved")
    constants = sorted({str(n.target) for n in gm.graph.nodes if n.op == "get_attr"})
    for name in constants:
        value = gm
        for part in name.split("."):
            value = getattr(value, part)
        tensors[f"const.{name}"] = value.detach().cpu().contiguous().clone()
    tensors["rng.cpu"] = call.rng.clone()  # the CPU generator's state at the first call (random ops)
    if sum(t.numel() * t.element_size() for t in tensors.values()) > MAX_SAVED_BYTES:
        raise ValueError(f"its inputs take more than {MAX_SAVED_BYTES >> 20} MiB")
    meta = {k: v for k, v in asdict(event).items() if k not in ("t", "rank")}
    meta["torch_version"] = torch.__version__
    files = {
        GRAPH_CODE: graph_source(gm).encode("utf-8"),
        GRAPH_INPUTS: json.dumps({"inputs": inputs, "constants": constants}).encode(),
        GRAPH_META: json.dumps(meta).encode(),
        TENSOR_FILES[0]: safetensors_bytes(tensors),
    }
    with output_folder(directory, files, inputs=(), force=False) as folder:
        for name, data in files.items():
            folder.write(name, data)
