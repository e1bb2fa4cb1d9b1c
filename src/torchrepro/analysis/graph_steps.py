"""Which compiled graphs ran in which step, and which of them can explain a divergent quantity.

A step's gradients come only from graphs whose backward ran in that step (a training graph: its
forward, which saved what the backward reads, and its backward); its loss from the forward of
such a graph; its parameters from those and from what ran after the last backward (a compiled
optimizer step runs under ``no_grad``). A graph that ran in the step only without gradients (an
evaluation under ``no_grad``, as nanoGPT's ``estimate_loss()`` before its first training step)
explains none of the three. Pure: event logs in, a :class:`GraphScope` out.

>>> scope = graph_scope("grads", 0, ["0/0/forward", "0/1/forward", "0/1/backward"])
>>> scope.graphs, scope.left_out
((('0/1', 'forward'), ('0/1', 'backward')), ('0/0',))
>>> scope.text()
'the gradients of step 0 come from compiled graph 0/1 (forward and backward); graph 0/0 ran in step 0 without a backward (under no_grad): it made no gradient'
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..eventlog.event_reader import EventLog
from ..eventlog.events import GraphProbe, GraphsRan

Graph = tuple[str, str]  # (compile id, "forward" | "backward")

# the quantities a compiled graph can explain (what a step computes); the rest (batch, rng,
# init_params) is decided from the step records before any graph is looked at
EXPLAINED_BY_GRAPHS = ("loss", "grads", "params")


@dataclass(frozen=True)
class GraphScope:
    """The compiled graphs that can explain ``quantity`` at ``step``, in the order the step first
    called them (``graphs``; None where it is not known which graphs the step ran: every graph may);
    ``left_out``: compile ids that ran in the step and cannot explain it."""

    quantity: str
    step: int
    graphs: tuple[Graph, ...] | None
    left_out: tuple[str, ...] = ()

    def admits(self, compile_id: str, graph: str) -> bool:
        """Whether ``compile_id``'s ``graph`` (forward or backward) can explain the quantity."""
        return self.graphs is None or (compile_id, graph) in self.graphs

    def compile_ids(self, also: Iterable[str] = ()) -> list[str]:
        """The compile ids that can explain the quantity, in the step's order (where not known:
        ``also``, the order some other record gives)."""
        ids = [cid for cid, _ in self.graphs] if self.graphs is not None else list(also)
        return list(dict.fromkeys(ids))

    def text(self) -> str | None:
        """What the scope is, in a sentence (None where every graph may explain the quantity)."""
        if self.graphs is None:
            return None
        what = _WHAT[self.quantity]
        left = ""
        if self.left_out:
            made = "changed no parameter" if self.quantity == "params" else f"made no {what[1]}"
            when = " before the step's last backward" if self.quantity == "params" else " (under no_grad)"
            left = f"graph {', '.join(self.left_out)} ran in step {self.step} without a backward{when}: it {made}"
        if not self.graphs:
            return f"no compiled graph that ran in step {self.step} can explain its {what[0]}" + (
                f"; {left}" if left else ""
            )
        parts = {cid: [g for c, g in self.graphs if c == cid] for cid in self.compile_ids()}
        named = ", ".join(f"{cid} ({' and '.join(graphs)})" for cid, graphs in parts.items())
        return f"the {what[0]} of step {self.step} {what[2]} from compiled graph {named}" + (
            f"; {left}" if left else ""
        )


_WHAT = {  # a quantity: its name, what a graph makes of it, its verb
    "loss": ("loss", "loss", "comes"),
    "grads": ("gradients", "gradient", "come"),
    "params": ("parameters", "parameter", "come"),
}


def graph_scope(quantity: str, step: int, ran: Sequence[str] | None) -> GraphScope:
    """The graphs of ``ran`` (what step ``step`` called, ``compile_id/forward`` and
    ``compile_id/backward`` in the order first called; None: not known) that can explain
    ``quantity``: for ``grads`` the forward and backward of each graph whose backward ran, for
    ``loss`` those forwards, for ``params`` those and the graphs first called after the step's last
    backward (every graph where none ran); any other quantity is not restricted."""
    if ran is None or quantity not in EXPLAINED_BY_GRAPHS:
        return GraphScope(quantity, step, None)
    called = [_split(key) for key in ran]
    training = {cid for cid, graph in called if graph == "backward"}
    if quantity == "grads":
        kept = [g for g in called if g[0] in training]
    elif quantity == "loss":
        kept = [g for g in called if g[0] in training and g[1] == "forward"]
    else:
        last = max((i for i, (_, graph) in enumerate(called) if graph == "backward"), default=-1)
        kept = [g for i, g in enumerate(called) if g[0] in training or i > last]
    left = [cid for cid, _ in called if cid not in {k[0] for k in kept}]
    return GraphScope(quantity, step, tuple(kept), tuple(dict.fromkeys(left)))


def _split(key: str) -> Graph:
    compile_id, _, graph = key.rpartition("/")
    return compile_id, graph


def graphs_ran(log: EventLog, step: int) -> list[str] | None:
    """The graphs rank ``log`` called in step ``step`` (``compile_id/forward``...), in the order first
    called: from its :class:`GraphsRan` events (the last at or before the step); where the log has
    none (a run without the graph probe, or of an older torchrepro), from its probes of graphs first
    called at or before the step; None where it has neither."""
    written = [e for e in log.of(GraphsRan) if e.step is not None]
    if written:
        before = [e for e in written if e.step is not None and e.step <= step]
        return list(before[-1].graphs) if before else []
    probed = [p for p in log.of(GraphProbe) if p.step is not None and p.step <= step and not p.error]
    if not probed:
        return None
    return list(dict.fromkeys(f"{p.compile_id}/{p.graph}" for p in probed))


def step_scope(quantity: str, step: int, logs: Sequence[EventLog], rank: int) -> GraphScope:
    """:func:`graph_scope` of ``quantity`` at ``step`` on ``rank`` of a run (``logs``, its ranks)."""
    log = next((log for log in logs if log.rank == rank), None)
    return graph_scope(quantity, step, graphs_ran(log, step) if log is not None else None)
