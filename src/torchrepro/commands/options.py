"""Option values checked once, at parse time: argparse ``type=`` functions with one message style
(``torchrepro: error: argument --timeout: must be a number > 0, got 'nan'``)."""

from __future__ import annotations

import argparse
import math
import re
import tarfile
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

Number = TypeVar("Number", int, float)


def _number(
    cast: Callable[[str], Number], what: str, low: float, low_ok: bool, high: float | None = None
) -> Callable[[str], Number]:
    """An option type: ``cast`` of the text, within the bounds (``low`` allowed when ``low_ok``)."""
    bound = f"{'>=' if low_ok else '>'} {low:g}" + (f" and <= {high:g}" if high is not None else "")

    def parse(text: str) -> Number:
        value: Number | None
        try:
            value = cast(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or value < low
            or (value == low and not low_ok)
            or (high is not None and value > high)
        ):
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


positive_int = _number(int, "an integer", 1, True)
count = _number(int, "an integer", 0, True)
positive_float = _number(float, "a number", 0, False)
tolerance = _number(float, "a number", 0, True)
fraction = _number(float, "a number", 0, True, 1)


def finite(text: str) -> float:
    """Any finite number (``drift --observed``: a difference, of either sign)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def seed(text: str) -> int:
    """A root seed: an integer in [0, 2**128) (what ``seed_everything`` accepts)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**128:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (and < 2**128), got {text!r}")
    return value


_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgtp]?)i?b?", re.IGNORECASE)


def size(text: str) -> int:
    """Bytes from ``500M``, ``2G``, ``1.5T`` or a plain number (powers of 1024)."""
    match = _SIZE.fullmatch(text.strip())
    value = int(float(match.group(1)) * 1024 ** _POWERS[match.group(2).lower()]) if match else 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a size of at least 1 byte such as 500M, 2G or 1T, got {text!r}")
    return value


def age(text: str) -> float:
    """Seconds in an age such as ``7d``, ``12h``, ``30m`` (see :func:`torchrepro.cache.inventory.parse_age`)."""
    from ..cache.inventory import parse_age
    from ..errors import UserError

    try:
        return parse_age(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def directory(text: str) -> str:
    """A directory that exists or can be created: not an existing regular file (or under one)."""
    path = Path(text)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(f"{parent} is a file, not a directory")
            break
    return text


def pack_file(text: str) -> str:
    """A torchrepro cache pack: an existing tar file (``.tar``, ``.tar.gz``)."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such cache pack: {text}")
    try:
        is_tar = tarfile.is_tarfile(path)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text}: {exc.strerror or exc}") from None
    if not is_tar:
        raise argparse.ArgumentTypeError(f"{text} is not a tar archive (make one with torchrepro cache pack)")
    return text


class Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``torchrepro: error: ...`` (exit 2), like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"torchrepro: error: {message} (see {self.prog} --help)\n")


def add_outputs(p: argparse.ArgumentParser, junit: bool = False) -> None:
    """``--json FILE`` (and ``--junit FILE``) with ``--force``: the files a command writes for the
    user, checked before anything runs (:func:`torchrepro.commands.outputs.check_args`)."""
    p.add_argument("--json", metavar="FILE", help="also write the report JSON here (a new file unless --force)")
    if junit:
        p.add_argument("--junit", metavar="FILE", help="write a JUnit XML result for CI (a new file unless --force)")
    p.add_argument("--force", action="store_true", help="replace the --json/--junit/--html files if they exist")


def runs(text: str) -> int:
    """``check --runs K``: at least 2 (there is nothing to compare with one run)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (there is nothing to compare with one run), got {text!r}")
    return value


def factors(text: str) -> list[str]:
    """``drift --vary``: a comma-separated list of known factors, each named once."""
    from ..analysis.drift import BINARY_FACTORS, RANDOM_FACTORS
    from ..render.sanitize import visible

    names = [n.strip() for n in text.split(",") if n.strip()]
    known = (*RANDOM_FACTORS, *BINARY_FACTORS)
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown factor(s) {visible(', '.join(unknown)) or '(none given)'}: give a comma-separated "
            f"list of {', '.join(known)}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"names a factor twice, got '{visible(text)}'")
    return names


def otlp_endpoint(text: str) -> str:
    """``--otlp-endpoint``: an ``http(s)://host[:port]`` URL (the URL is echoed escaped in the error)."""
    from urllib.parse import urlsplit

    from ..render.sanitize import visible

    problem = None
    if any(not c.isprintable() or c.isspace() for c in text):
        problem = "a control or space character in it"
    else:
        try:
            url = urlsplit(text)
            port = url.port  # ValueError: a port out of range or not a number
        except ValueError as exc:
            problem = str(exc)
        else:
            if url.scheme not in ("http", "https"):
                problem = "no http:// or https:// scheme"
            elif not url.hostname:
                problem = "no host name"
            elif port == 0:
                problem = "port 0"
    if problem:
        raise argparse.ArgumentTypeError(
            f"give the collector's http(s) URL, e.g. http://localhost:4318 ({problem}), got '{visible(text)}'"
        )
    return text


OTLP_ENDPOINT_VARS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


def otlp_endpoint_from_env(args: argparse.Namespace) -> None:
    """The standard ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variables turn export on as ``--otlp-endpoint``
    does, the flag winning over ``OTEL_EXPORTER_OTLP_ENDPOINT``. Without both, the base URL is a
    per-signal URL less its ``/v1/traces`` (``/v1/metrics``) path; a per-signal URL stays the URL of
    its signal (the exporter reads it). Each variable in use is checked like the flag: a bad one is
    a :class:`~torchrepro.errors.InputError` (exit 2)."""
    import os

    from ..errors import InputError

    if not hasattr(args, "otlp_endpoint"):
        return
    for var in OTLP_ENDPOINT_VARS[0 if args.otlp_endpoint is None else 1 :]:
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        try:
            otlp_endpoint(value)
        except argparse.ArgumentTypeError as exc:
            raise InputError(f"{var}: {exc}") from None
        if args.otlp_endpoint is None:
            path = "/v1/" + var.split("_")[3].lower()  # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: /v1/traces
            args.otlp_endpoint = value.removesuffix(path) if var != OTLP_ENDPOINT_VARS[0] else value


def add_otlp_option(parser: argparse.ArgumentParser, *, in_process: bool = False) -> None:
    """Add ``--otlp-endpoint URL`` and ``--otel-service-name NAME`` to a command's parser.
    ``in_process``: the command runs the capture session itself (``torchrepro run``), so the
    session exports and there is no launcher span.

    >>> add_otlp_option(sub.add_parser("doctor"))  # doctest: +SKIP
    """
    parser.add_argument(
        "--otlp-endpoint",
        type=otlp_endpoint,
        metavar="URL",
        help="export spans and metrics over OTLP/HTTP to this collector, live "
        "(e.g. http://localhost:4318; default: OTEL_EXPORTER_OTLP_ENDPOINT; OTEL_EXPORTER_OTLP_* variables apply)",
    )
    parser.add_argument(
        "--otel-service-name",
        metavar="NAME",
        help="service.name of the exported telemetry (default: OTEL_SERVICE_NAME, else torchrepro)",
    )
    parser.set_defaults(otlp_in_process=in_process)


def add_script(p: argparse.ArgumentParser, required: bool = True) -> None:
    """``SCRIPT [ARGS...]``: the training script and its arguments."""
    p.add_argument("script", nargs=None if required else "?", metavar="SCRIPT", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments (after --)")


def add_ranks(p: argparse.ArgumentParser) -> None:
    """How a command launches its runs: ranks, stall timeout, compile-cache policy."""
    p.add_argument(
        "--nproc", type=positive_int, default=1, metavar="N", help="launch N ranks with torchrun (standalone)"
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        metavar="S",
        help="end the job after S seconds without progress, dumping every rank's Python stack; ended before "
        "any rank started, it is said as such (exit 3, no rank started within S s)",
    )
    p.add_argument(
        "--cache-policy",
        choices=("per-node", "shared", "per-rank"),
        help="compile-cache directory per node (default when set), shared, or per rank",
    )
    p.add_argument(
        "--cache-root", type=directory, metavar="DIR", help="where --cache-policy puts the cache directories"
    )
    p.add_argument(
        "--warm-from",
        type=pack_file,
        metavar="PACK",
        help="unpack this torchrepro cache pack on every rank first, if a key in TORCHREPRO_TRUSTED_KEYS signed it "
        "(otherwise: a warning and a cold start)",
    )
    p.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="--warm-from also unpacks a pack no trusted key signed (a compile cache is code: only your own)",
    )


def add_strict(p: argparse.ArgumentParser) -> None:
    """``--strict``: degraded capture fails the command."""
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) when capture degraded (CAPTURE_DEGRADED: an observer failed, records unreadable)",
    )


def add_tolerance(p: argparse.ArgumentParser) -> None:
    """``--rtol`` / ``--atol`` (default 0: bit-exact)."""
    p.add_argument("--rtol", type=tolerance, default=0.0, help="relative tolerance (default 0: bit-exact)")
    p.add_argument("--atol", type=tolerance, default=0.0, help="absolute tolerance (default 0: bit-exact)")


def add_html(p: argparse.ArgumentParser) -> None:
    """``--html FILE``: the report as one HTML page."""
    p.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page here")
