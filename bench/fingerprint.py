"""Fingerprint throughput next to `clone()` of the same float32 bytes, measured side by side.

Run: `python bench/fingerprint.py [--repeats 7] [--threads N]`. Each figure is GB/s
(10^9 bytes per second) from the median time of one call; the functions take turns,
call by call, for at least `--repeats` rounds and about half a second. "module" is an nn.Module
whose 256 KiB parameters total the size; "tensor" is one tensor of that size.
Columns: fp = `fingerprint`, clone = `clone()` of every tensor, copy_ = `copy_` into
buffers allocated beforehand (bandwidth without allocation), device = `_device_digest`,
the path for CUDA and other devices, run on CPU here for information only.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Callable

import torch
from torch import nn

from torchrepro.digests import _device_digest, fingerprint

MiB = 1 << 20
PARAM_BYTES = 256 * 1024


def gbps(fns: list[Callable[[], object]], nbytes: int, repeats: int) -> list[float]:
    """GB/s of each function from its median call; the calls take turns (side by side)."""
    start = time.perf_counter()
    for fn in fns:
        fn()  # warm-up
    rounds = max(repeats, int(0.5 / (time.perf_counter() - start)))
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, ts in zip(fns, times):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
    return [nbytes / statistics.median(ts) / 1e9 for ts in times]


def cases(nbytes: int) -> list[tuple[str, nn.Module | torch.Tensor, list[torch.Tensor]]]:
    module = nn.Module()
    module.params = nn.ParameterList(nn.Parameter(torch.randn(PARAM_BYTES // 4)) for _ in range(nbytes // PARAM_BYTES))
    tensor = torch.randn(nbytes // 4)
    return [(f"module ({len(module.params)} params)", module, list(module.parameters())), ("tensor", tensor, [tensor])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu = platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu}, median call")
    print(f"{'GB/s':>7}  {'case':<21} {'fp':>7} {'clone':>7} {'fp/clone':>8} {'copy_':>7} {'device':>7}")
    for mib in (1, 64, 512):
        nbytes = mib * MiB
        for name, obj, tensors in cases(nbytes):
            targets = [torch.empty_like(t) for t in tensors]
            with torch.no_grad():
                fp, cl, cp, dev = gbps(
                    [
                        lambda: fingerprint(obj),
                        lambda: [t.clone() for t in tensors],
                        lambda: [d.copy_(t) for d, t in zip(targets, tensors)],
                        lambda: [_device_digest(t) for t in tensors],
                    ],
                    nbytes,
                    args.repeats,
                )
            print(f"{mib:>4} MB  {name:<21} {fp:>7.2f} {cl:>7.2f} {fp / cl:>7.2f}x {cp:>7.2f} {dev:>7.2f}")


if __name__ == "__main__":
    main()
