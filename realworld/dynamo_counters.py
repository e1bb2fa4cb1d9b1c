"""Ground truth for `torchrepro doctor`'s compile counts: run an unmodified script as `python SCRIPT
ARGS` would (runpy, `__main__`, its folder first on sys.path), and when the process exits write
Dynamo's own bookkeeping to a JSON file. Nothing of torchrepro is imported.

    python realworld/dynamo_counters.py OUT.json SCRIPT [ARGS...]

Under torchrun every rank runs it: `{rank}` in OUT.json becomes the process's RANK (0 without one),
so that each rank writes its own file.

The numbers follow the correspondence documented in docs/evidence/accuracy.md ("Report field <-> Dynamo's
own numbers"): compiles = compilation-metrics records with a code name and no failure, recompiles =
those of them with a recompile reason, graph breaks = the records `TORCH_LOGS=graph_breaks` logs
(:class:`BreakRecords`; the script's stderr shows them as that setting would), unique graphs =
`counters["stats"]["unique_graphs"]`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import runpy
import sys


class BreakRecords(logging.Handler):
    """Counts the graph-break records ``TORCH_LOGS=graph_breaks`` logs (installed with
    ``torch._logging.set_logs(graph_breaks=True)``): one per break Dynamo met, a break it cannot
    resume from once where it restarts or skips the frame and once more where it meets it again."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.endswith(".__graph_breaks"):
            self.count += 1


BREAKS = BreakRecords()


def _is_recompile(metrics: object) -> bool:
    """Dynamo's own word where it records one (``recompile_reason``, torch 2.7 and later); before, a
    frame compiled again: its compile id ``frame/n`` with n above 0 (``_k`` after it counts restarts)."""
    if hasattr(metrics, "recompile_reason"):
        return bool(metrics.recompile_reason)
    compile_id = str(getattr(metrics, "compile_id", None) or "")
    return "/" in compile_id and compile_id.split("/")[-1].split("_")[0] not in ("", "0")


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
            "recompiles": sum(1 for m in metrics if _is_recompile(m)),
            "graph_breaks": BREAKS.count,
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
    import torch

    torch._logging.set_logs(graph_breaks=True)
    logging.getLogger("torch._dynamo").addHandler(BREAKS)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
