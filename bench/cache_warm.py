"""Warm starts on CPU, measured: time to the first compiled training step (forward + backward)
in a fresh process, for a small CNN and a small transformer block, starting

  cold        from an empty inductor cache directory,
  warm-same   from the directory the cold run filled,
  pack        on a new machine (an empty TMPDIR: no precompiled headers) from a torchrepro pack
              of it, unpacked into an empty directory (the unpack is timed as "prep"),
  pack-bare   the same with a pack made with --no-headers,
  mega        from torch.compiler.save_cache_artifacts() bytes, loaded into an empty directory;

then the cost of each cache policy on a 2-rank DDP job (torchrun, gloo; tests/scripts/cache_ddp.py,
a small MLP and the transformer block): first-step time and hit rate of a cold start and of a
restart, disk used, and fresh directories warmed from a pack (prewarm).

Usage: python bench/cache_warm.py [--models cnn,transformer] [--ddp-models mlp,transformer] [--repeat N]
                                 [--work DIR]          ('' for either list skips that part)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DDP_SCRIPT = REPO / "tests" / "scripts" / "cache_ddp.py"
THREADS = "1"  # part of inductor's cache key: the same in every process


def _model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "cnn":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(32, 10),
        )
        return model, torch.randn(8, 3, 32, 32)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0, batch_first=True)
    return layer, torch.randn(4, 16, 64)


def child(args: argparse.Namespace) -> None:
    """One fresh process: (load mega-cache bytes,) compile, one forward + backward; JSON to stdout."""
    import torch
    from torch._dynamo.utils import counters

    from torchrepro.cache.layout import headers_dir

    prep = 0.0
    if args.mega_load:
        start = time.perf_counter()
        torch.compiler.load_cache_artifacts(Path(args.mega_load).read_bytes())
        prep = time.perf_counter() - start
    model, x = _model(args.child)
    compiled = torch.compile(model)
    start = time.perf_counter()
    compiled(x).square().mean().backward()
    first = time.perf_counter() - start
    if args.mega_save:
        artifacts = torch.compiler.save_cache_artifacts()
        Path(args.mega_save).write_bytes(artifacts[0] if artifacts else b"")
    print(
        json.dumps(
            {
                "first_step_s": first,
                "prep_s": prep,
                "headers_dir": str(headers_dir()),
                "fx": {
                    k.rsplit("_", 1)[1]: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache_")
                },
                "aot": {
                    k.rsplit("_", 1)[1]: v
                    for k, v in counters["aot_autograd"].items()
                    if k.startswith("autograd_cache_")
                },
            }
        )
    )


def _env(cache: Path | None = None, machine: Path | None = None) -> dict[str, str]:
    """The children's environment; ``machine``: their TMPDIR, which holds inductor's default
    directory and so its precompiled headers (a fresh one is a new machine)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHREPRO_CACHE_ROOT")
    }
    env["OMP_NUM_THREADS"] = THREADS
    if cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    if machine is not None:
        env["TMPDIR"] = str(machine)
    return env


def _run_child(model: str, cache: Path, machine: Path, *extra: str) -> dict:
    machine.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", model, *extra],
        capture_output=True,
        text=True,
        env=_env(cache, machine),
        timeout=900,
    )
    if proc.returncode:
        raise SystemExit(f"child failed ({model}, {cache}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _hits(result: dict) -> str:
    return (
        f"fx {result['fx'].get('hit', 0)}/{result['fx'].get('hit', 0) + result['fx'].get('miss', 0)}, "
        f"aot {result['aot'].get('hit', 0)}/{result['aot'].get('hit', 0) + result['aot'].get('miss', 0)}"
    )


def _median(runs: list[dict]) -> dict:
    """The run with the median first-step time."""
    return sorted(runs, key=lambda r: r["first_step_s"])[len(runs) // 2]


def bench_model(model: str, work: Path, repeat: int) -> dict[str, dict]:
    from torchrepro.cache import pack, unpack

    base = work / model
    machine_a, mega = base / "machine-a", base / "mega.bin"
    # Machine A: a TMPDIR of its own, whose precompiled C++ headers (~150 MB, kept in inductor's
    # default directory whatever TORCHINDUCTOR_CACHE_DIR says) a throwaway compile builds first, so
    # that every start on machine A below pays the same.
    headers_a = Path(_run_child(model, base / "warm-up", machine_a)["headers_dir"])
    rows = {"cold": _run_child(model, base / "cold", machine_a, "--mega-save", str(mega))}
    rows["warm-same"] = _median([_run_child(model, base / "cold", machine_a) for _ in range(repeat)])
    pack(base / "warm.tar", base / "cold", headers_from=headers_a)
    pack(base / "bare.tar", base / "cold", headers=False)

    def from_pack(name: str, tag: str) -> dict:
        """A new machine (empty TMPDIR): unpack (timed as prep), then the first step."""
        machine = base / f"machine-{tag}"
        start = time.perf_counter()
        target, headers = base / f"cache-{tag}", machine / headers_a.relative_to(machine_a)
        unpack(base / name, into=target, headers_into=headers, allow_unsigned=True)  # packed by this script
        prep = time.perf_counter() - start
        return {**_run_child(model, base / f"cache-{tag}", machine), "prep_s": prep}

    rows["pack"] = _median([from_pack("warm.tar", f"pack-{i}") for i in range(repeat)])
    rows["pack-bare"] = from_pack("bare.tar", "bare")
    rows["mega"] = _run_child(model, base / "from-mega", machine_a, "--mega-load", str(mega))
    rows["sizes"] = {
        "pack": (base / "warm.tar").stat().st_size,
        "bare": (base / "bare.tar").stat().st_size,
        "mega": mega.stat().st_size,
    }
    return rows


def _torchrun(out: Path, model: str, policy: str, root: Path, warm_from: Path | None = None) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(DDP_SCRIPT),
        str(out),
        "--model",
        model,
        "--policy",
        policy,
        "--root",
        str(root),
    ]
    proc = subprocess.run(
        cmd + (["--warm-from", str(warm_from)] if warm_from else []),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=900,
    )
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    if len(ranks) != 2:
        raise SystemExit(f"DDP run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return ranks


def _summary(ranks: list[dict]) -> dict:
    """The job's first step (its slowest rank), the hit rate over all ranks, and how many ranks compiled."""
    hit = sum(r["fx"].get("hit", 0) + r["aot"].get("hit", 0) for r in ranks)
    looked = hit + sum(r["fx"].get("miss", 0) + r["aot"].get("miss", 0) for r in ranks)
    return {
        "first_step_s": max(r["job_first_step_s"] for r in ranks),
        "hit_rate": hit / looked if looked else None,
        "compiled_ranks": sum(bool(r["fx"].get("miss")) for r in ranks),
    }


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench_policies(model: str, work: Path, repeat: int) -> dict[str, dict]:
    from torchrepro.cache import pack

    base = work / "policies" / model
    _torchrun(base / "warm-up-results", model, "shared", base / "warm-up")  # precompiled headers, as above
    rows = {}
    for policy in ("per-rank", "shared", "per-node"):
        colds, restarts = [], []
        for i in range(repeat):
            root = base / f"{policy}-{i}"
            colds.append(_summary(_torchrun(root / "cold-results", model, policy, root / "cache")))
            restarts.append(_summary(_torchrun(root / "restart-results", model, policy, root / "cache")))
        rows[policy] = {
            "cold": _median(colds),
            "restart": _median(restarts),
            "disk_bytes": _size(base / f"{policy}-0" / "cache"),
        }
    # The prewarm flow: a build step compiled once (the shared cold run above), pack it, and start
    # fresh directories from the pack: no rank compiles.
    warm = base / "warm.tar"
    pack(warm, base / "shared-0" / "cache", headers=False)  # same machine: its headers are there
    for policy in ("per-rank", "per-node"):
        firsts = [
            _summary(
                _torchrun(
                    base / f"{policy}-prewarm-{i}" / "results",
                    model,
                    policy,
                    base / f"{policy}-prewarm-{i}" / "cache",
                    warm,
                )
            )
            for i in range(repeat)
        ]
        rows[f"{policy}+prewarm"] = {
            "cold": _median(firsts),
            "restart": None,
            "disk_bytes": _size(base / f"{policy}-prewarm-0" / "cache"),
        }
    return rows


def _print_warm_starts(results: dict[str, dict[str, dict]]) -> None:
    print(f"\n{'model':12} {'start':10} {'first step':>10} {'prep':>7} {'speedup':>8}  hits")
    for model, rows in results.items():
        sizes = rows.pop("sizes")
        cold = rows["cold"]["first_step_s"]
        for name, r in rows.items():
            total = r["first_step_s"] + r["prep_s"]
            print(
                f"{model:12} {name:10} {r['first_step_s']:9.2f}s {r['prep_s']:6.2f}s {cold / total:7.1f}x  {_hits(r)}"
            )
        print(
            f"{'':12} sizes: pack {sizes['pack'] / 1e6:.1f} MB, without headers {sizes['bare'] / 1e6:.2f} MB, "
            f"mega-cache {sizes['mega'] / 1e6:.2f} MB"
        )
    speedups = [
        rows["cold"]["first_step_s"] / (rows["pack"]["first_step_s"] + rows["pack"]["prep_s"])
        for rows in results.values()
    ]
    print(
        f"pack vs cold: {statistics.mean(speedups):.1f}x on average (speedup counts prep: unpack, or "
        "load_cache_artifacts)"
    )


def _print_policies(results: dict[str, dict[str, dict]]) -> None:
    print(
        f"\n2-rank DDP (torchrun, gloo); a job's first step ends when its slowest rank's does\n"
        f"{'model':12} {'policy':17} {'cold step':>9} {'hits':>5} {'compiled':>8}  {'restart':>8} {'hits':>5}  "
        f"{'disk':>7}"
    )
    for model, rows in results.items():
        for policy, row in rows.items():
            c, r = row["cold"], row["restart"]
            again = f"{r['first_step_s']:7.2f}s {r['hit_rate']:5.0%}" if r else f"{'-':>8} {'-':>5}"
            print(
                f"{model:12} {policy:17} {c['first_step_s']:8.2f}s {c['hit_rate']:5.0%} {c['compiled_ranks']:>6}/2  "
                f"{again}  {row['disk_bytes'] / 1e6:5.2f}MB"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn,transformer", help="models of the warm-start runs ('' skips them)")
    parser.add_argument(
        "--ddp-models", default="mlp,transformer", help="models of the 2-rank DDP policy runs ('' skips them)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each warm start and policy (median shown)")
    parser.add_argument("--work", help="keep the caches here (default: a temporary directory, removed)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mega-save", help=argparse.SUPPRESS)
    parser.add_argument("--mega-load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="torchrepro-cache-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"torch {__import__('torch').__version__}, {os.cpu_count()} CPUs, OMP_NUM_THREADS={THREADS}, work {work}")
    try:
        results = {model: bench_model(model, work, args.repeat) for model in args.models.split(",") if model}
        if results:
            _print_warm_starts(results)
        if args.ddp_models:
            _print_policies({model: bench_policies(model, work, args.repeat) for model in args.ddp_models.split(",")})
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
