"""``torchrepro env``: versions, determinism switches, caches and risky settings."""

from __future__ import annotations

import argparse
import io
import sys
from typing import Any

from . import options


def add_parser(sub: Any) -> None:
    """Register ``env``."""
    p = sub.add_parser("env", help="versions, determinism switches, caches and risky settings")
    options.add_json_output(p, "write the environment as JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print this environment (``--json FILE``: write it as JSON there; ``-``, or ``--json`` alone:
    on stdout); a torch outside the tested range is said on stderr too (``torch_tested.outside`` in
    the JSON)."""
    from ..capture import environment as envinfo
    from ..render.env_text import render_env
    from .outputs import write_args

    info = envinfo.collect()
    if args.json:
        text = io.StringIO()
        envinfo.write_json(info, text)
        write_args(args, args.json, text.getvalue().encode())
    else:
        render_env(info)
    if info["torch_tested"]["outside"]:
        print(f"torchrepro: warning: {info['torch_tested']['outside']}", file=sys.stderr)
    return 0
