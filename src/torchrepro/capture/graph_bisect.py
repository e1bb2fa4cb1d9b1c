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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .._compat import compiler_bisector, dynamo_reset
from .repro_script import call, load_graph, load_tensors, same_outputs

BACKENDS = ("eager", "aot_eager", "aot_eager_decomp_partition", "inductor")


def _matches_eager(here: Path, backend: str | None) -> Any:
    """A test: the graph saved in ``here`` compiled (with ``backend``, else the one the bisector
    says) gives eager's outputs bit for bit."""
    spec = json.loads((here / "inputs.json").read_text(encoding="utf-8"))
    tensors = load_tensors(here)
    rng = tensors.pop("rng.cpu")
    graph = load_graph(here, tensors, spec["constants"])
    eager = call(graph, spec["inputs"], tensors, rng)

    def test() -> bool:
        dynamo_reset()
        compiled = torch.compile(graph, backend=backend) if backend else torch.compile(graph)
        return bool(same_outputs(call(compiled, spec["inputs"], tensors, rng), eager))

    return test


def bisect(here: Path) -> str:
    """What makes the graph in ``here`` differ from eager: ``backend inductor, subsystem lowerings,
    application 3 (aten.mm)``; or that it matches eager under every backend."""
    meta = json.loads((here / "meta.json").read_text(encoding="utf-8"))
    threads = torch.get_num_threads()
    torch.set_num_threads(int(meta.get("threads") or threads))
    try:
        bisector = compiler_bisector()
        if bisector is not None:
            result = bisector.do_bisect(_matches_eager(here, None))
            if result is None:
                return "the compiled graph matches eager bit for bit under every backend"
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
            if not _matches_eager(here, backend)():
                return f"backend {backend} (the first of {', '.join(BACKENDS)} to differ from eager)"
        return "the compiled graph matches eager bit for bit under every backend"
    finally:
        torch.set_num_threads(threads)
