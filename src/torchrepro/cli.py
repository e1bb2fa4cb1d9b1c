"""The `torchrepro` command: parse arguments, dispatch, turn user errors into one line."""

from __future__ import annotations

import argparse
import sys

from .errors import UserError


def _cmd_env(args: argparse.Namespace) -> int:
    from . import envinfo

    info = envinfo.collect()
    if args.json:
        envinfo.write_json(info, sys.stdout)
    else:
        envinfo.render(info)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrepro",
        description="Reproducible torch.compile training, and why a run is not.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    env = sub.add_parser("env", help="versions, determinism switches, caches and risky settings")
    env.add_argument("--json", action="store_true", help="print machine-readable JSON")
    env.set_defaults(func=_cmd_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as exc:
        print(f"torchrepro: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("torchrepro: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
