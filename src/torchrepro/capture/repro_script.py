"""Reproduce one compiled graph of a training run, standalone: needs torch (and safetensors where
the inputs were saved as ``inputs.safetensors``), neither the training script nor torchrepro.

    python repro.py [--runs K] [--threads N] [--backend inductor]

It loads the graph's FX code (``graph.py``: the aten graph the compiler was given, its parameters
as inputs) and the inputs of its first call in the run, compiles it with ``torch.compile``, calls
it K times on fresh copies of those inputs and compares every output bit for bit (run to run),
then compares the compiled outputs with the same graph run eagerly (compiled vs eager). Exit 1
when either differs (the divergence reproduces), 0 when both agree bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable

import torch

HERE = Path(__file__).resolve().parent


def load_tensors(here: Path) -> dict[str, torch.Tensor]:
    if (here / "inputs.safetensors").exists():
        from safetensors.torch import load_file

        loaded: dict[str, torch.Tensor] = load_file(str(here / "inputs.safetensors"))
        return loaded
    saved: dict[str, torch.Tensor] = torch.load(here / "inputs.pt", weights_only=True)
    return saved


def load_graph(here: Path, tensors: dict[str, torch.Tensor], constants: list[str]) -> torch.nn.Module:
    namespace: dict[str, Any] = {"__name__": "graph"}
    exec(compile((here / "graph.py").read_text(encoding="utf-8"), str(here / "graph.py"), "exec"), namespace)
    graph: torch.nn.Module = namespace["Graph"]()
    for name in constants:
        owner, path = graph, name.split(".")
        for part in path[:-1]:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.register_buffer(path[-1], tensors["const." + name])
    return graph


def fresh_inputs(spec: list[dict[str, Any]], tensors: dict[str, torch.Tensor]) -> list[Any]:
    out: list[Any] = []
    for item in spec:
        if item["kind"] == "value":
            out.append(item["value"])
            continue
        saved = tensors[item["key"]]
        x = torch.empty_strided(item["size"], item["stride"], dtype=saved.dtype, device=item["device"])
        out.append(x.copy_(saved))
    return out


def flat(values: Any) -> list[Any]:
    if isinstance(values, (list, tuple)):
        return [leaf for v in values for leaf in flat(v)]
    return [values]


def digest(x: Any) -> str:
    if not isinstance(x, torch.Tensor):
        return repr(x)
    data = x.detach().cpu().contiguous().reshape(-1)
    raw = data.view(torch.uint8) if data.numel() else data
    return f"{x.dtype}{tuple(x.shape)}:" + hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]


def max_abs(x: Any, y: Any) -> float:
    if not isinstance(x, torch.Tensor) or not x.numel() or x.shape != y.shape:
        return float("nan")
    return float((x.detach().double() - y.detach().double()).abs().max())


def same_outputs(xs: list[Any], ys: list[Any]) -> bool:
    return len(xs) == len(ys) and all(digest(x) == digest(y) for x, y in zip(xs, ys))


def call(
    fn: Callable[..., Any], spec: list[dict[str, Any]], tensors: dict[str, torch.Tensor], rng: torch.Tensor
) -> list[Any]:
    torch.random.set_rng_state(rng)
    with torch.no_grad():
        return flat(fn(*fresh_inputs(spec, tensors)))


def main() -> int:
    meta = json.loads((HERE / "meta.json").read_text(encoding="utf-8"))
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=max(8, meta.get("repeats") or 0), help="compiled calls compared")
    parser.add_argument("--threads", type=int, default=meta.get("threads") or torch.get_num_threads())
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = json.loads((HERE / "inputs.json").read_text(encoding="utf-8"))
    tensors = load_tensors(HERE)
    rng = tensors.pop("rng.cpu")
    graph = load_graph(HERE, tensors, spec["constants"])
    compiled = torch.compile(graph, backend=args.backend)
    what = f"compiled graph {meta['compile_id']} ({meta['graph']}), torch {torch.__version__}, {args.threads} thread(s)"
    print(f"{what}: recorded with torch {meta.get('torch_version')}")
    first = call(compiled, spec["inputs"], tensors, rng)
    reference = [digest(x) for x in first]
    differing: set[int] = set()
    runs_differing, largest = 0, 0.0
    for _ in range(args.runs - 1):
        outs = call(compiled, spec["inputs"], tensors, rng)
        now = {i for i, x in enumerate(outs) if digest(x) != reference[i]}
        runs_differing += bool(now)
        differing |= now
        largest = max([largest] + [max_abs(first[i], outs[i]) for i in now])
    reproduced = False
    if differing:
        reproduced = True
        print(
            f"RUN TO RUN: DIFFERS: {runs_differing} of {args.runs - 1} repeated calls differ from the first, "
            f"output(s) {sorted(differing)}, by up to {largest:.3g}"
        )
    else:
        print(f"run to run: {args.runs} calls bit for bit the same")
    eager = call(graph, spec["inputs"], tensors, rng)
    against = [i for i, (x, y) in enumerate(zip(first, eager)) if digest(x) != digest(y)]
    if against:
        reproduced = True
        worst = max(max_abs(first[i], eager[i]) for i in against)
        print(f"COMPILED VS EAGER: DIFFERS: output(s) {against[:10]} differ, by up to {worst:.3g}")
    else:
        print("compiled vs eager: bit for bit the same")
    print(f"recorded in the run: {meta.get('runs_differing')} of {meta.get('repeats')} repeats differed")
    return 1 if reproduced else 0


if __name__ == "__main__":
    sys.exit(main())
