"""``torchrepro cache status|explain-miss|pack|unpack|verify|clear``: registered here, implemented
in :mod:`torchrepro.cache.cli` (each sub-command sets its own ``func``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..cache import cli


def add_parser(sub: Any) -> None:
    """Register ``cache`` and its sub-commands."""
    cli.add_parser(sub)


def run(args: argparse.Namespace) -> int:
    """Run the cache sub-command the arguments name."""
    return args.func(args)
