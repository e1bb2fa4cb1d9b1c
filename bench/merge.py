"""How long does a report over many ranks take? Synthetic run directories of N ranks x E events
each (steps, compiles, recompiles, graph breaks, cache lookups), then read + analyse + report,
timed separately, with the time per event so linear scaling shows as a flat column.

    .venv/bin/python bench/merge.py                  # 2, 64 and 1024 ranks of 10 000 events
    .venv/bin/python bench/merge.py --ranks 2 8 --events 2000

"vs json" is the whole time (read + analyse) over a bare ``json.loads`` of every line of the same
logs, measured just before in the same process.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from torchrepro.analysis.doctor import analyse
from torchrepro.events import (
    CacheLookup,
    Compile,
    Counters,
    End,
    GraphBreak,
    Header,
    Params,
    Step,
)
from torchrepro.rundir import load_run


def rank_log(events: int) -> str:
    """One rank's log as text (rank 0); every 50th event a compile-side event, the rest steps."""
    out = [Header(world_size=1), Params(names=[f"layer{i}.weight" for i in range(8)], shapes=[[64, 64]] * 8,
                                        dtypes=["float32"] * 8, kinds=["tensor"] * 8)]
    step = 0
    for i in range(events - 4):
        if i % 50 == 0:
            kind = (i // 50) % 3
            if kind == 0:
                out.append(Compile(step=step, compile_id=f"0/{i // 150}", function="forward", file="train.py", line=10,
                                   dynamo_s=0.2, guards=40, graph_ops=30,
                                   recompile_reasons=["tensor 'x' size mismatch at index 0. expected 32, actual 8"]
                                   if i else [], category="shape" if i else None))
            elif kind == 1:
                out.append(GraphBreak(step=step, compile_id="0/0", reason="Data-dependent branching", gb_id="GB0170",
                                      file="train.py", line=12))
            else:
                out.append(CacheLookup(step=step, compile_id="0/0", cache="fxgraph", status="hit", key="abc"))
        else:
            # like a DDP run: parameters and RNG agree across ranks, batches are per rank (BATCH)
            fp = f"{step:016x}"
            out.append(Step(step=step, index=step, loss=1.0 / (step + 1), time_s=0.05, params_fp=fp,
                            param_fps=[f"{step:012x}{j:04x}" for j in range(8)], batch_fp="BATCH" + fp[5:],
                            rng_fp=fp, rng_fps={"torch_cpu": fp, "numpy": fp, "python": fp}))
            step += 1
    out += [Counters(counters={"stats": {"unique_graphs": 3}}), End(step=step, duration_s=10.0)]
    return "".join(json.dumps(e.to_json(), separators=(",", ":")) + "\n" for e in out)


def make_run(root: Path, ranks: int, text: str) -> None:
    for rank in range(ranks):
        folder = root / f"rank-{rank}"
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_text(text.replace('"rank":0', f'"rank":{rank}').replace("BATCH", f"{rank:05x}"))


def bare_json(root: Path) -> float:
    """Seconds for a bare ``json.loads`` of every line of every rank's log (the yardstick)."""
    t0 = time.perf_counter()
    for file in sorted(root.glob("rank-*/events.jsonl")):
        with open(file, "rb") as fp:
            for line in fp:
                json.loads(line)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 64, 1024])
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    text = rank_log(args.events)
    print(f"{'ranks':>6} {'events':>11} {'json s':>7} {'read s':>8} {'analyse s':>10} {'total s':>8} {'vs json':>8} "
          f"{'µs/event':>9} {'max RSS MB':>10}")
    for ranks in args.ranks:
        root = Path(tempfile.mkdtemp(prefix="torchrepro-merge-"))
        try:
            make_run(root, ranks, text)
            bare = bare_json(root)
            t0 = time.perf_counter()
            run = load_run(root)
            t1 = time.perf_counter()
            report = analyse(run.meta, run.logs, run.problems)
            t2 = time.perf_counter()
            assert report.steps.per_rank["0"].steps > 0
            total = ranks * args.events
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{ranks:>6} {total:>11,} {bare:>7.2f} {t1 - t0:>8.2f} {t2 - t1:>10.2f} {t2 - t0:>8.2f} "
                  f"{(t2 - t0) / bare:>7.2f}x {(t2 - t0) / total * 1e6:>9.2f} {rss:>10.0f}", flush=True)
            del run, report
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
