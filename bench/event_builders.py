"""CPU time of ``events.from_json`` per step event, this tree next to another (``--baseline
OTHER/src``), and ``orjson.loads`` of the same lines as the yardstick, in one run.

    .venv/bin/python bench/event_builders.py --baseline /work/main/src
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from merge import rank_log  # noqa: E402


def events_module(src: Path, name: str) -> ModuleType:
    """``torchrepro/events.py`` of the source tree ``src``, imported on its own under ``name``."""
    spec = importlib.util.spec_from_file_location(name, src / "torchrepro" / "events.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def per_step_us(build, lines: list[bytes]) -> float:
    """Best of 9 of the CPU µs per line (fresh dicts each round: ``from_json`` consumes them)."""
    best = float("inf")
    for _ in range(9):
        parsed = [orjson.loads(line) for line in lines]
        t0 = time.process_time()
        for data, line in zip(parsed, lines):
            build(data, line)
        best = min(best, time.process_time() - t0)
    return best / len(lines) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, required=True, metavar="SRC")
    args = parser.parse_args()
    lines = [line.encode() for line in rank_log(3000).splitlines() if '"kind":"step"' in line]
    this = events_module(Path(__file__).parents[1] / "src", "events_this")
    base = events_module(args.baseline, "events_baseline")
    gc.disable()
    print(
        f"from_json per step event (CPU µs): this {per_step_us(lambda d, _: this.from_json(d), lines):.2f}, "
        f"baseline {per_step_us(lambda d, _: base.from_json(d), lines):.2f}; "
        f"orjson.loads of the line {per_step_us(lambda _, line: orjson.loads(line), lines):.2f}"
    )


if __name__ == "__main__":
    main()
