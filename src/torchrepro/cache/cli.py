"""`torchrepro cache ...` subcommands (being written)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``torchrepro cache`` and its subcommands on the main parser."""
