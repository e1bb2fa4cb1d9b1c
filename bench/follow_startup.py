"""What the start-up hook costs a process that is no rank (a helper, a DataLoader or compile worker):
the same command in fresh interpreters with and without the variables torchrepro.runtime.follow gives the
children of a captured run, alternated, best of N; prints the ratio.

    .venv/bin/python bench/follow_startup.py                # python -c pass, and import torch
    .venv/bin/python bench/follow_startup.py --rounds 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchrepro.capture.session import CaptureConfig
from torchrepro.runtime.follow import SEEN_VAR, follow_env

COMMANDS = {"python -c pass": "pass", "import torch": "import torch"}


def timed(code: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    with tempfile.TemporaryDirectory() as tmp:
        followed = {
            **base,
            **follow_env(CaptureConfig(run_dir=Path(tmp)), os.getpid(), base.get("PYTHONPATH", "")),
            SEEN_VAR: "::",
        }
        print(f"{'command':<16} {'plain s':>9} {'followed s':>11} {'ratio':>7}   (best of {args.rounds})")
        for name, code in COMMANDS.items():
            plain, hooked = [], []
            for _ in range(args.rounds):
                plain.append(timed(code, base))
                hooked.append(timed(code, followed))
            print(f"{name:<16} {min(plain):9.4f} {min(hooked):11.4f} {min(hooked) / min(plain):7.3f}")
        assert not any(Path(tmp).iterdir()), "a process that is no rank was captured"


if __name__ == "__main__":
    main()
