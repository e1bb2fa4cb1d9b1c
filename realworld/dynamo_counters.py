"""Ground truth for `torchrepro doctor`'s compile counts: run an unmodified script as `python SCRIPT
ARGS` would (runpy, `__main__`, its folder first on sys.path), and when the process exits write
Dynamo's own bookkeeping to a JSON file. Nothing of torchrepro is imported.

    python realworld/dynamo_counters.py OUT.json SCRIPT [ARGS...]

Under torchrun every rank runs it: `{rank}` in OUT.json becomes the process's RANK (0 without one),
so that each rank writes its own file.

The numbers follow the correspondence documented in docs/accuracy.md ("Report field <-> Dynamo's
own numbers"): compiles = compilation-metrics records with a code name and no failure, recompiles =
those of them with a recompile reason, graph breaks = `counters["graph_break"]` plus the
`counters["unimplemented"]` entries of other break types (:func:`graph_breaks`), unique graphs =
`counters["stats"]["unique_graphs"]`.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys


def graph_breaks(counters) -> int:
    """``counters["graph_break"]``, plus the breaks counted only in ``counters["unimplemented"]``
    (data-dependent branching, a break that makes Dynamo skip its frame): those entries whose first
    line (the break's type) is not one of a ``graph_break`` entry's (the same break, counted there
    when Dynamo met it again in a frame of its own), other than the recompile limit (no break) and a
    generator Dynamo declines to trace (a frame not compiled, no break)."""
    counted = {msg.splitlines()[0] for msg in counters["graph_break"]}
    more = sum(
        n
        for msg, n in counters["unimplemented"].items()
        if "recompile limit" not in msg
        and msg.splitlines()[0] not in counted
        and not msg.startswith("Attempt to trace generator")
    )
    return sum(counters["graph_break"].values()) + more


def _dump(out: str, pid: int) -> None:
    """Write the counters, in the process that started the script only (a forked DataLoader
    worker that happens to run atexit handlers must not overwrite them)."""
    if os.getpid() != pid or "torch._dynamo" not in sys.modules:
        counts = {"compiles": 0, "recompiles": 0, "graph_breaks": 0, "unique_graphs": 0, "dynamo_imported": False}
    else:
        from torch._dynamo.utils import counters, get_compilation_metrics

        metrics = [m for m in get_compilation_metrics() if m.co_name and not m.fail_type]
        counts = {
            "compiles": len(metrics),
            "recompiles": sum(1 for m in metrics if m.recompile_reason),
            "graph_breaks": graph_breaks(counters),
            "unique_graphs": counters["stats"]["unique_graphs"],
            "dynamo_imported": True,
        }
    if os.getpid() == pid:
        with open(out, "w") as f:
            json.dump(counts, f)


def main() -> None:
    out, script, *args = sys.argv[1:]
    out = out.format(rank=os.environ.get("RANK", "0"))
    atexit.register(_dump, os.path.abspath(out), os.getpid())
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
