"""``torchrepro env``: versions, determinism switches, caches and risky settings."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    """Register ``env``."""
    p = sub.add_parser("env", help="versions, determinism switches, caches and risky settings")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print this environment (as JSON with ``--json``); a torch outside the tested range is said on
    stderr too (``torch_tested.outside`` in the JSON)."""
    from ..capture import environment as envinfo
    from ..render.env_text import render_env

    info = envinfo.collect()
    if args.json:
        envinfo.write_json(info, sys.stdout)
    else:
        render_env(info)
    if info["torch_tested"]["outside"]:
        print(f"torchrepro: warning: {info['torch_tested']['outside']}", file=sys.stderr)
    return 0
