"""How long does a report over many ranks take? Synthetic run directories of N ranks x E events
each (steps, compiles, recompiles, graph breaks, cache lookups), then read + analyse + report,
timed separately, with the time per event so linear scaling shows as a flat column.

    .venv/bin/python bench/merge.py                  # 2, 64 and 1024 ranks of 10 000 events
    .venv/bin/python bench/merge.py --ranks 2 8 --events 2000
    .venv/bin/python bench/merge.py --ranks 64 --events 3000 --rounds 5   # medians, the ratio's min-max

Each size is written twice: as the writer writes it now (``compact``: steps in ``steps.bin``) and
with every step a JSON line (``lines``, as torchrepro.events/1 wrote it); ``--logs compact`` writes
and times only the first (1024 x 10 000 as lines is 5.7 GB, and no "vs json" then). "vs json" is the whole
time (read + analyse) over a bare ``json.loads`` of every line of the ``lines`` logs (the same
events as JSON lines), measured just before in the same child process (one per row, whose own peak RSS is printed:
the yardstick reads one line at a time, so the peak is read + analyse), in CPU seconds and on the
wall clock. Reading is the report's (each rank's steps reduced as it is read, by one process
per core for logs over 128 MB; ``--jobs N`` sets the processes): CPU seconds are those of the
child and of its reading processes, the peak RSS the larger of the two. ``--baseline OTHER/src``
times another source tree on the same logs right after (before/after side by side; a tree from
before the reduced reader reads whole events); ``--keep DIR`` keeps the logs (and reuses them).

    .venv/bin/python bench/merge.py --ranks 64 --events 3000 --baseline /work/main/src
    .venv/bin/python bench/merge.py --ranks 1024 --events 10000 --logs compact --keep /tmp/merge

(A baseline tree from before the compact step stream reads ``compact`` logs as torchrepro.events/2,
which it refuses: compare it on the ``lines`` rows.)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import CacheLookup, Compile, Counters, End, GraphBreak, Header, Params, Step


def rank_log(events: int, rank: int) -> list:
    """One rank's events; every 50th event a compile-side event, the rest steps."""
    out = [
        Header(rank=rank, world_size=1),
        Params(
            rank=rank,
            names=[f"layer{i}.weight" for i in range(8)],
            shapes=[[64, 64]] * 8,
            dtypes=["float32"] * 8,
            kinds=["tensor"] * 8,
        ),
    ]
    step = 0
    for i in range(events - 4):
        if i % 50 == 0:
            kind = (i // 50) % 3
            if kind == 0:
                out.append(
                    Compile(
                        rank=rank,
                        step=step,
                        compile_id=f"0/{i // 150}",
                        function="forward",
                        file="train.py",
                        line=10,
                        dynamo_s=0.2,
                        guards=40,
                        graph_ops=30,
                        recompile_reasons=["tensor 'x' size mismatch at index 0. expected 32, actual 8"] if i else [],
                    )
                )
            elif kind == 1:
                out.append(
                    GraphBreak(
                        rank=rank,
                        step=step,
                        compile_id="0/0",
                        reason="Data-dependent branching",
                        gb_id="GB0170",
                        file="train.py",
                        line=12,
                    )
                )
            else:
                out.append(
                    CacheLookup(rank=rank, step=step, compile_id="0/0", cache="fxgraph", status="hit", key="abc")
                )
        else:
            # like a DDP run: parameters and RNG agree across ranks, batches are per rank
            fp = f"{step:016x}"
            out.append(
                Step(
                    t=1_000_000.0 + step * 0.0501,
                    rank=rank,
                    step=step,
                    index=step,
                    loss=1.0 / (step + 1),
                    time_s=0.05,
                    params_fp=fp,
                    param_fps=[f"{step:012x}{j:04x}" for j in range(8)],
                    batch_fp=f"{rank:05x}" + fp[5:],
                    rng_fp=fp,
                    rng_fps={"torch_cpu": fp, "numpy": fp, "python": fp},
                )
            )
            step += 1
    out += [Counters(rank=rank, counters={"stats": {"unique_graphs": 3}}), End(rank=rank, step=step, duration_s=10.0)]
    return out


def make_run(root: Path, ranks: int, events: int, compact: bool) -> None:
    for rank in range(ranks):
        write_all(root / f"rank-{rank}" / "events.jsonl", rank_log(events, rank), compact_steps=compact)


def bare_json(root: Path) -> float:
    """Seconds for a bare ``json.loads`` of every line of every rank's log (the yardstick)."""
    t0 = time.perf_counter()
    for file in sorted(root.glob("rank-*/events.jsonl")):
        with open(file, "rb") as fp:
            for line in fp:
                json.loads(line)
    return time.perf_counter() - t0


# A fresh interpreter per measurement, so its peak RSS is its own: the yardstick, then read + analyse,
# each timed on the wall clock and in CPU seconds (what a shared, loaded machine perturbs least).
_CHILD = """
import json, resource, sys, time
from pathlib import Path
from torchrepro.analysis.doctor import analyse
from torchrepro.eventlog.rundir import load_run
sys.path.insert(0, sys.argv[2])
from merge import bare_json
try:  # the report's reader: each rank's steps reduced as read, JOBS processes (a tree from before: whole events)
    from torchrepro.analysis import kept_steps
    keep = getattr(kept_steps, "StepReducer", None) or kept_steps.KeptSteps.of  # (a tree from before: steps to reduce)
    options = {"keep": keep, "jobs": None if sys.argv[3] == "auto" else int(sys.argv[3])}
except ImportError:
    options = {}
def clocks():  # CPU seconds of this process and of the reading processes it waited for
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
c0 = clocks()
if sys.argv[4] != "-":  # (no lines logs: no yardstick)
    bare_json(Path(sys.argv[4]))
c1 = clocks()
run = load_run(sys.argv[1], **options)
c2 = clocks()
report = analyse(run.meta, run.logs, run.problems)
c3 = clocks()
rss_mb = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
print(json.dumps({"wall": [c1[0] - c0[0], c2[0] - c1[0], c3[0] - c2[0]],
                  "cpu": [c1[1] - c0[1], c2[1] - c1[1], c3[1] - c2[1]], "rss_mb": rss_mb}))
"""


def report_child(root: Path, lines: Path | None, src: str | None, jobs: str) -> dict[str, Any]:
    """Time json (of ``lines``, unless None), read and analyse of ``root`` in a child process
    (``src``: the torchrepro source tree it imports; ``jobs``: its reading processes, or ``auto``)."""
    env = dict(os.environ, **({"PYTHONPATH": src} if src else {}))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root), str(Path(__file__).parent), jobs, str(lines or "-")],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


def disk(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 64, 1024])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument(
        "--baseline",
        metavar="SRC",
        help="also time the torchrepro source tree SRC (e.g. another "
        "checkout's src/) on the same logs, right after, in the same run",
    )
    parser.add_argument(
        "--jobs", default="auto", help="reading processes (default auto: as `torchrepro report` chooses)"
    )
    parser.add_argument("--keep", metavar="DIR", type=Path, help="write the logs under DIR (reused if it holds them)")
    parser.add_argument(
        "--logs",
        nargs="+",
        choices=("lines", "compact"),
        default=["lines", "compact"],
        help="the logs to write and time (the json yardstick reads the lines logs: without them, no 'vs json')",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure each row this many times, the rows taking turns; print medians"
    )
    args = parser.parse_args()
    print(
        "CPU seconds (wall seconds in the last columns); json: a bare json.loads of the same events as lines; "
        "with --rounds, medians and the CPU ratio's min-max"
    )
    print(
        f"{'ranks':>6} {'events':>11} {'logs':>8} {'MB':>7} {'tree':>8} {'json s':>7} {'read s':>7} {'analyse s':>9} "
        f"{'total s':>7} {'vs json':>7} {'min-max':>11} {'µs/event':>8} {'wall s':>7} {'vs json':>7} {'peak RSS MB':>11}"
    )
    trees = [("this", None)] + ([("baseline", args.baseline)] if args.baseline else [])
    for ranks in args.ranks:
        base = args.keep / f"{ranks}x{args.events}" if args.keep else Path(tempfile.mkdtemp(prefix="torchrepro-merge-"))
        try:
            roots = {name: base / name for name in args.logs}
            for name, root in roots.items():
                if not (root / f"rank-{ranks - 1}" / "events.jsonl").exists():
                    make_run(root, ranks, args.events, compact=name == "compact")
            total = ranks * args.events
            rows = [(name, tree, src) for name in roots for tree, src in trees]
            found: dict[tuple[str, str], list[dict[str, Any]]] = {(name, tree): [] for name, tree, _ in rows}
            for _ in range(args.rounds):
                for name, tree, src in rows:
                    found[name, tree].append(report_child(roots[name], roots.get("lines"), src, args.jobs))
            for name, tree, _ in rows:
                runs = found[name, tree]
                ratios = [(r["cpu"][1] + r["cpu"][2]) / r["cpu"][0] if "lines" in roots else math.nan for r in runs]
                bare, read, analysed = (statistics.median(r["cpu"][i] for r in runs) for i in range(3))
                wall = [statistics.median(r["wall"][i] for r in runs) for i in range(3)]
                both, wall_both = read + analysed, wall[1] + wall[2]
                print(
                    f"{ranks:>6} {total:>11,} {name:>8} {disk(roots[name]) / 1e6:>7.1f} {tree:>8} {bare:>7.2f} "
                    f"{read:>7.2f} {analysed:>9.2f} {both:>7.2f} {statistics.median(ratios):>6.2f}x "
                    f"{min(ratios):>5.2f}-{max(ratios):<5.2f} {both / total * 1e6:>8.2f} {wall_both:>7.2f} "
                    f"{wall_both / wall[0] if 'lines' in roots else math.nan:>6.2f}x {max(r['rss_mb'] for r in runs):>11.0f}",
                    flush=True,
                )
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
