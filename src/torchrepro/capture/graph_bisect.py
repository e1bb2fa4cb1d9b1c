"""``torchrepro repro --bisect``: which part of ``torch.compile`` makes a saved compiled graph
(:mod:`.graph_probe`) differ from the same graph run eagerly.

The test compiles the graph afresh and compares its outputs with eager's bit for bit, at the
thread count the run had. Torch's compiler bisector (``CompilerBisector``, through
:mod:`torchrepro._compat`) runs it under each backend in turn (``eager``, ``aot_eager``,
``aot_eager_decomp_partition``, ``inductor``), then within the first that differs, each subsystem
(decompositions, pre-grad / joint-graph / post-grad passes, config switches such as
``fallback_random``, lowerings) and bisects the number of applications down to one. It works the
same for inductor's C++ kernels and Triton kernels. Where this torch lacks the bisector, the
backends alone are tried.

The graph's code is the run's: it runs here, in a process of its own that torchrepro starts
(``python -m torchrepro.capture.graph_bisect DIR [MODULE...]``), never in torchrepro's. That process prints one
JSON line, ``{"found": "backend inductor, ..."}`` or ``{"found": null}`` (the graph matches eager
under every backend) or ``{"error": "graph.py: ..."}``, and exits 0 (a cause named), 1 (nothing to
name) or 2 (it could not run).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from .._compat import compiler_bisector, dynamo_reset
from .repro_script import Saved, Unusable, call, load_graph, load_saved, same_outputs

BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor")


def _matches_eager(saved: Saved, tensors: dict[str, torch.Tensor], rng: torch.Tensor, backend: str | None) -> Any:
    """A test: the saved graph compiled (with ``backend``, else the one the bisector says) gives
    eager's outputs bit for bit."""
    graph = load_graph(saved, tensors)
    eager = call(graph, saved.inputs, tensors, rng)

    def test() -> bool:
        dynamo_reset()
        compiled = torch.compile(graph, backend=backend) if backend else torch.compile(graph)
        return bool(same_outputs(call(compiled, saved.inputs, tensors, rng), eager))

    return test


def bisect(here: Path, modules: Sequence[str] = ()) -> str | None:
    """What makes the graph saved in ``here`` differ from eager: ``backend inductor, subsystem
    lowerings, application 3 (aten.mm)``; None when it matches eager under every backend.
    ``modules`` are imported first (a custom op's). :class:`~.repro_script.Unusable` for a saved
    graph that cannot be used."""
    saved, tensors, rng = load_saved(here, modules)
    threads = torch.get_num_threads()
    torch.set_num_threads(int(saved.meta.get("threads") or threads))
    try:
        bisector = compiler_bisector()
        if bisector is not None:
            result = bisector.do_bisect(_matches_eager(saved, tensors, rng, None))
            if result is None:
                return None
            parts = [f"backend {result.backend}"]
            if getattr(result, "subsystem", None):
                parts.append(f"subsystem {result.subsystem}")
            if getattr(result, "bisect_number", None) is not None and result.subsystem:
                parts.append(f"application {result.bisect_number}")
            found = ", ".join(parts)
            if getattr(result, "debug_info", None):
                found += f" ({' '.join(str(result.debug_info).split())[:200]})"
            return found
        for backend in BACKENDS:
            if not _matches_eager(saved, tensors, rng, backend)():
                return f"backend {backend} (the first of {', '.join(BACKENDS)} to differ from eager)"
        return None
    finally:
        torch.set_num_threads(threads)


def main(argv: list[str] | None = None) -> int:
    """The bisection's own process: ``argv[0]`` is the folder of the saved graph, the rest modules to
    import first; one JSON line out."""
    here, *modules = sys.argv[1:] if argv is None else argv
    try:
        found = bisect(Path(here), modules)
    except Unusable as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 2
    except Exception as exc:  # noqa: BLE001 -- the compiler or the graph failed: one line for torchrepro to say
        print(json.dumps({"error": f"the bisection failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"}))
        return 2
    print(json.dumps({"found": found}), flush=True)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
