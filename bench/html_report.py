"""How big is the HTML report, and how long does it take, as ranks grow? Synthetic run directories
(tests/synthetic_runs.py: most ranks alike, two different) read, analysed and rendered, timed
separately; the page size should follow the number of distinct rank behaviours, not the ranks.

    .venv/bin/python bench/html_report.py                 # 8, 64, 1024 ranks, and 8 ranks x 50 compiles
    .venv/bin/python bench/html_report.py --ranks 2048
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from synthetic_runs import write_run

from torchrepro.analysis.doctor import analyse
from torchrepro.render.html import render_html
from torchrepro.eventlog.rundir import load_run


def measure(root: Path, label: str) -> None:
    t0 = time.perf_counter()
    run = load_run(root)
    t1 = time.perf_counter()
    report = analyse(run.meta, run.logs, run.problems)
    t2 = time.perf_counter()
    page = render_html(report)
    t3 = time.perf_counter()
    print(
        f"{label:>22} {len(report.rank_groups['groups']):>7} {report.compile['compiles']:>9} "
        f"{t1 - t0:>7.2f} {t2 - t1:>10.2f} {t3 - t2:>9.3f} {t3 - t0:>8.2f} {len(page.encode()) / 1e3:>9.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 1024])
    args = parser.parse_args()
    print(
        f"{'run':>22} {'groups':>7} {'compiles':>9} {'read s':>7} {'analyse s':>10} {'render s':>9} "
        f"{'total s':>8} {'page KB':>9}"
    )
    work = Path(tempfile.mkdtemp(prefix="torchrepro-html-"))
    try:
        for ranks in args.ranks:
            measure(
                write_run(work / f"r{ranks}", ranks, odd=(min(7, ranks - 1),), crashed=(ranks - 2,)), f"{ranks} ranks"
            )
        measure(write_run(work / "compiles", 8, steps=60, recompiles=49, odd=(3,)), "8 ranks x 50 compiles")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
