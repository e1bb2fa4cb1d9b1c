"""Probe every compiled graph for nondeterminism directly, in the run itself.

Two whole runs that happen to agree do not show a race between threads that shows in only some
calls. Here each inductor graph (forward and backward) keeps a copy of the inputs of its first
call, the RNG state it started from and digests of what it returned; after the step it ran in
(the step recorder's listener, so outside the step's own time), it is called again
``repeats`` times on fresh copies of those inputs, in this process at this thread count, and every
output is compared bit for bit with the first call's. A graph whose outputs differ is written as
a :class:`~torchrepro.eventlog.events.GraphProbe` event, explained as the kernel replay explains
one (:meth:`~torchrepro.capture.kernels.KernelRepeater.explain`: parameter, FX node, op, kernel,
source line).

Observation does not perturb the run: the repeats run on copies (a graph that writes into its
inputs writes into the copies), without autograd, from the RNG state of the first call, and the
RNG state of the moment is put back afterwards; the run's parameters and outputs are untouched.
The copies are dropped once probed. Used by ``check`` (every run) and ``doctor --probe``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..eventlog.events import Event, GraphProbe
from ..eventlog.payloads import NodeInfo
from .fx_nodes import first_line, leaves, node_info, same
from .kernels import KernelRepeater, _copy, _digests


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
    """Keeps the first call of each compiled graph and calls it again after the step (see the module)."""

    def __init__(self, emit: Callable[[Event], None], repeats: int) -> None:
        super().__init__()
        self.emit, self.repeats = emit, repeats
        self.pending: dict[str, _Call] = {}  # "compile_id/graph" -> its first call, not probed yet
        self.seen: set[str] = set()
        self.fx: dict[str, Any] = {}  # "compile_id/graph" -> its aten FX graph, as inductor was given it

    def _compiling(self, key: str, gm: Any) -> None:
        import copy

        try:
            self.fx[key] = copy.deepcopy(gm)  # inductor's passes rewrite gm in place
        except Exception as exc:  # the node-level naming is lost, the probe still runs
            self.errors.append(f"copying compiled graph {key}: {first_line(exc)}")

    def _wrap(self, real: Any, compile_id: str, graph: str) -> Any:
        key = f"{compile_id}/{graph}"

        def run(args: list[Any]) -> Any:
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
        """The step recorder's listener: probe every graph first called since the last step."""
        while self.pending:
            _, call = self.pending.popitem()
            event = self.probe(call)
            event.step = index if index >= 0 else None
            self.emit(event)

    def probe(self, call: _Call) -> GraphProbe:
        """Call ``call`` again :attr:`repeats` times on copies of its inputs; what differed."""
        event = GraphProbe(compile_id=call.compile_id, graph=call.graph, threads=torch.get_num_threads())
        state = torch.random.get_rng_state()
        start = time.perf_counter()
        self._ours = True
        try:
            first: list[Any] | None = None
            differing: set[int] = set()
            runs_differing, largest = 0, None
            with torch.no_grad():
                for _ in range(self.repeats):
                    torch.random.set_rng_state(call.rng)
                    outs = leaves(call.real([_copy(x) for x in call.inputs]))
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
            event.runs_differing, event.differing, event.max_abs = runs_differing, sorted(differing), largest
            if differing:
                explained: dict[str, Any] = dict(self.explain(call.compile_id, call.graph, min(differing)))
                gm = self.fx.get(f"{call.compile_id}/{call.graph}")
                node = first_differing_node(gm, call) if gm is not None else None
                if node is not None:  # the FX graph run eagerly shows where: that node names it
                    explained.update(eager_node=node["node"], op=node["target"], source=node["source"])
                    explained["module"] = node["module"]
                event.explained = explained
        except Exception as exc:  # the probe's own failure: said in the event, the run goes on
            event.error = first_line(exc)
        finally:
            self._ours = False
            torch.random.set_rng_state(state)
            event.time_s = round(time.perf_counter() - start, 6)
        return event


EAGER_TRIES = 4  # eager interpretations of a differing graph compared node by node


def first_differing_node(gm: Any, call: _Call) -> NodeInfo | None:
    """The first node of ``gm`` (the aten FX graph the compiled one was made from) whose value is not
    bit for bit the same in two eager interpretations on copies of ``call``'s inputs (up to
    :data:`EAGER_TRIES` pairs: a race shows in only some), or None."""
    import torch.fx

    def values() -> dict[str, list[str | None]]:
        seen: dict[str, list[str | None]] = {}

        class Recorder(torch.fx.Interpreter):
            def run_node(self, n: Any) -> Any:
                out = super().run_node(n)
                if n.op == "call_function":
                    seen[n.name] = _digests(leaves(out))
                return out

        torch.random.set_rng_state(call.rng)
        with torch.no_grad():
            Recorder(gm).run(*[_copy(x) for x in call.inputs])
        return seen

    first = values()
    for _ in range(EAGER_TRIES):
        again = values()
        for n in gm.graph.nodes:
            if n.name in first and first[n.name] != again.get(n.name):
                return {**node_info(n), "target": str(n.target)}  # qualified: aten.mm.default
    return None
