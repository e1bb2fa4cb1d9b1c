"""``torchrepro compare A.py [ARGS] :: B.py [ARGS]``: is configuration B the same training as
configuration A? Runs A (the reference) twice and B once, and judges B against A's run-to-run
band (:mod:`torchrepro.analysis.equivalence`; docs/compare.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import options
from ..errors import InputError
from ._finish import Outcome

SEPARATOR = "::"


def add_parser(sub: Any) -> None:
    """Register ``compare``."""
    p = sub.add_parser(
        "compare",
        help="is configuration B the same training as A? (A twice for its noise band, B once)",
        description="Run configuration A (the reference) twice and B once, and judge B against A's run-to-run "
        "noise: EQUIVALENT, DIFFERENT (the first step, rank and tensor out of the band) or ABSTAIN. "
        "Usage: torchrepro compare [--nproc N] [--nproc-b M] A.py [A_ARGS] :: B.py [B_ARGS]",
    )
    p.add_argument("--nproc-b", type=options.processes, metavar="M", help="ranks of B (default: --nproc)")
    p.add_argument(
        "--resume-b-at",
        type=options.positive_int,
        metavar="K",
        help="B stops after step K with a checkpoint and resumes in a fresh process (torchrepro.checkpoint); "
        "the resumed run is compared",
    )
    p.add_argument("--seed", type=options.seed, help="seed everything (and PYTHONHASHSEED) from this root in every run")
    p.add_argument("--out", type=options.directory, metavar="DIR", help="where the runs and report go")
    options.add_outputs(p, html=True)
    options.add_ranks(p)
    options.add_otlp_option(p)
    options.add_script(p, script_help="configuration A's script (the reference)", sides=SEPARATOR)
    p.set_defaults(func=run)


def split_sides(script: str, args: list[str]) -> tuple[tuple[str, list[str]], tuple[str, list[str], str | None]]:
    """``A.py a-args :: B.py b-args`` → ``((A.py, a-args), (B.py, b-args, None))``; a ``--`` right
    after either script is dropped. B may be ``-m MODULE`` (then ``(its file, b-args, MODULE)``).

    >>> split_sides("a.py", ["--x", "1", "::", "b.py", "--", "--y"])
    (('a.py', ['--x', '1']), ('b.py', ['--y'], None))
    """
    if args.count(SEPARATOR) != 1:
        raise InputError(
            f"compare needs two configurations: A.py [ARGS] {SEPARATOR} B.py [ARGS] "
            f"(found {args.count(SEPARATOR)} '{SEPARATOR}')"
        )
    at = args.index(SEPARATOR)
    a_args, rest = args[:at], args[at + 1 :]
    if not rest or rest == ["-m"]:
        raise InputError(f"no script after '{SEPARATOR}': give B's script, e.g. {SEPARATOR} train.py --ddp")

    def strip(xs: list[str]) -> list[str]:
        return xs[1:] if xs and xs[0] == "--" else xs

    if rest[0] != "-m":
        return (script, strip(a_args)), (rest[0], strip(rest[1:]), None)
    try:
        return (script, strip(a_args)), (options.module_script(rest[1]), strip(rest[2:]), rest[1])
    except argparse.ArgumentTypeError as exc:
        raise InputError(f"B: {exc}") from None


def run(args: argparse.Namespace) -> Outcome:
    """Run A twice and B once, and judge B against A's band."""
    from ..eventlog.rundir import default_run_dir
    from .api import cache_of, compare

    (script_a, args_a), (script_b, args_b, module_b) = split_sides(args.script, args.args)
    out = Path(args.out) if args.out else default_run_dir(script_a, label="compare")
    report = compare(
        (script_a, args_a),
        (script_b, args_b),
        nproc=args.nproc,
        nproc_b=args.nproc_b,
        resume_b_at=args.resume_b_at,
        seed=args.seed,
        out=out,
        timeout=args.timeout,
        cache=cache_of(args),
        module=args.module,
        module_b=module_b,
    )
    return Outcome(report, out)
