"""Option values checked once, at parse time: argparse ``type=`` functions with one message style
(``torchrepro: error: argument --timeout: must be a number > 0, got 'nan'``)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tarfile
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Callable, NoReturn, TypeVar

from ..render.sanitize import visible

Number = TypeVar("Number", int, float)
STDOUT = "-"  # an output file named so goes to stdout


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


PROCESS_LIMIT_VAR = "TORCHREPRO_MAX_PROCESSES"  # a site's own bound on the processes one option starts
PROCESSES_PER_CORE = 4  # the default bound: this many processes per core this process may use


def process_limit() -> tuple[int, str]:
    """The most processes one option (``--nproc``, ``--jobs``) may start on this machine, and why:
    :data:`PROCESSES_PER_CORE` per usable core (ranks that mostly wait on each other still run on
    a laptop; a typo such as ``--nproc 100000`` does not fork the machine to death), or
    ``TORCHREPRO_MAX_PROCESSES`` where a site sets its own (a node with more devices than that).

    >>> process_limit()  # doctest: +SKIP
    (8, '4 per usable core, 2 cores here')"""
    import os

    from ..eventlog.rundir import usable_cores

    said = os.environ.get(PROCESS_LIMIT_VAR, "").strip()
    if said:
        try:
            return positive_int(said), f"{PROCESS_LIMIT_VAR}={said}"
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{PROCESS_LIMIT_VAR} {exc}") from None
    cores = usable_cores()
    return PROCESSES_PER_CORE * cores, f"{PROCESSES_PER_CORE} per usable core, {cores} core(s) here"


def processes(text: str) -> int:
    """How many processes an option starts at once (``--nproc``, ``--nproc-b``, ``--jobs``): an
    integer from 1 to :func:`process_limit`, checked before anything starts."""
    value = positive_int(text)
    if (problem := over_process_limit(value)) is not None:
        raise argparse.ArgumentTypeError(f"{problem}, got {text!r}")
    return value


def over_process_limit(count: int) -> str | None:
    """What is wrong with starting ``count`` processes at once on this machine (None: nothing):
    ``must be at most 8 (4 per usable core, 2 core(s) here; set TORCHREPRO_MAX_PROCESSES=N to allow more)``."""
    limit, why = process_limit()
    return f"must be at most {limit} ({why}; set {PROCESS_LIMIT_VAR}=N to allow more)" if count > limit else None


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
    """Usage errors as one line, ``torchrepro: error: ...`` (exit 2), like every other error. A
    command that runs a script (:func:`add_script`) takes ``SCRIPT [ARGS...]`` or ``-m MODULE
    [ARGS...]``: everything after the script or module is the script's; one of the command's own
    options among those is said in one warning line (:func:`stray_options`), unless ``--`` says
    they are the script's."""

    takes_script = False  # add_script sets these
    script_required = False
    sides: str | None = None  # compare: the separator of configuration A's and B's command lines

    def error(self, message: str) -> NoReturn:
        # an option with other spellings (--nproc, --nproc-per-node) is named by its first
        message = re.sub(r"^argument (-[\w-]+)(?:/-[\w-]+)+:", r"argument \1:", message)
        self.exit(2, f"torchrepro: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if self.takes_script and args is not None:
            self._script_arguments(list(args), parsed)
        return parsed, extras

    def _script_arguments(self, given: list[str], parsed: argparse.Namespace) -> None:
        """Set ``script``, ``module`` and ``args`` from the command line as it was given (argparse
        drops a ``--`` it meets, and cannot tell an option after ``-m MODULE`` from its own)."""
        if parsed.module is not None:  # -m MODULE ARGS: everything after -m is the module's
            at = next(i for i, a in enumerate(given) if a.startswith("-m"))  # argparse's -m: the first
            tokens = ([given[at][2:]] if len(given[at]) > 2 else []) + given[at + 1 :]
            if not tokens:
                self.error("-m needs a MODULE to run (as python -m takes it: package.module)")
            parsed.module, tail = tokens[0], tokens[1:]
            try:
                parsed.script = module_script(parsed.module)
            except argparse.ArgumentTypeError as exc:
                self.error(str(exc))
        elif parsed.script is None and self.script_required:
            self.error("give the SCRIPT to run (or -m MODULE)")
        else:
            tail, start = list(parsed.args), len(given) - len(parsed.args)
            if tail and start > 0 and given[start:] == tail and given[start - 1] == "--":
                tail = ["--", *tail]  # argparse dropped the "--" right after the script
        explicit = tail[:1] == ["--"]
        parsed.args = tail[1:] if explicit else tail
        stray = stray_options(self, parsed.args, explicit)
        if stray:
            name = visible(f"-m {parsed.module}" if parsed.module else parsed.script)
            said = f"{', '.join(stray)} after {name} {'is' if len(stray) == 1 else 'are'} the script's"
            print(
                f"torchrepro: warning: {said}, not {self.prog}'s: put {'it' if len(stray) == 1 else 'them'} "
                f"before {name} to give {'it' if len(stray) == 1 else 'them'} to torchrepro (write {name} -- ARGS "
                "when they are the script's)",
                file=sys.stderr,
            )


def stray_options(parser: Parser, tokens: list[str], explicit: bool = False) -> list[str]:
    """The command's own options (``--json``, ``--max-recompiles=0``) among a script's arguments,
    up to a ``--`` (what follows it is the script's, said so); for ``compare``, on each side of
    :attr:`Parser.sides`, B's own ``--`` after B's script.

    >>> p = Parser(prog="torchrepro doctor"); _ = p.add_argument("--json")
    >>> stray_options(p, ["--epochs", "2", "--json=x.json", "--", "--json"])
    ['--json']
    """
    own = {name for name in parser._option_string_actions if name not in ("-h", "--help")}
    found: list[str] = []
    at = 0
    while at < len(tokens):
        token = tokens[at]
        if parser.sides is not None and token == parser.sides:  # B's script (or -m MODULE), then B's arguments
            at += 3 if tokens[at + 1 : at + 2] == ["-m"] else 2
            explicit = tokens[at : at + 1] == ["--"]
            continue
        name = token.split("=", 1)[0] if token.startswith("--") else token
        if token == "--":
            explicit = True
        elif not explicit and name in own and name not in found:
            found.append(name)
        at += 1
    return found


def module_script(module: str) -> str:
    """The file ``python -m MODULE`` would run (a package: its ``__main__``), found as Python finds
    it (the working directory first, then ``sys.path``) without importing anything of it; an
    :class:`argparse.ArgumentTypeError` when there is none."""
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        raise argparse.ArgumentTypeError(
            f"-m {visible(module)}: not a module name (give it as python -m takes it: package.module)"
        )
    try:  # a top-level name imports nothing
        spec = PathFinder.find_spec(parts[0], [os.getcwd()]) or find_spec(parts[0])
    except (ImportError, ValueError):  # ValueError: a module imported already, without a spec
        spec = None
    for at in range(1, len(parts)):
        below = _locations(spec)
        if below is None:
            spec = None
            break
        try:
            spec = PathFinder.find_spec(".".join(parts[: at + 1]), below)
        except KeyError:  # a namespace package in a package: importlib looks its parent up in sys.modules
            spec = ModuleSpec(".".join(parts[: at + 1]), None, is_package=True)
            spec.submodule_search_locations = [p for d in below if os.path.isdir(p := os.path.join(d, parts[at]))]
    if (below := _locations(spec)) is not None:  # a package runs its __main__
        spec = PathFinder.find_spec(f"{module}.__main__", below)
        if spec is None:
            raise argparse.ArgumentTypeError(
                f"-m {visible(module)}: a package with no __main__ module, so it cannot be run"
            )
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        raise argparse.ArgumentTypeError(
            f"-m {visible(module)}: no such module in the working directory or on sys.path"
        )
    return spec.origin


def _locations(spec: ModuleSpec | None) -> list[str] | None:
    """Where a package's modules are (None: not a package), as found: a namespace package's list is
    not looked up again on ``sys.path`` (the package was found in the working directory)."""
    found = spec.submodule_search_locations if spec is not None else None
    return None if found is None else list(getattr(found, "_path", found))


def add_outputs(p: argparse.ArgumentParser, *, html: bool = False) -> None:
    """What a command that reaches a verdict writes for the user: ``--json FILE``, ``--junit
    FILE`` (and ``--html FILE``), each ``-`` for stdout; ``--force`` to replace them;
    ``--absolute-paths`` to keep full paths in them. Checked before anything runs
    (:func:`torchrepro.commands.outputs.check_args`)."""
    _add_json(p, "also write the report JSON here")
    p.add_argument(
        "--junit",
        metavar="FILE",
        help="write a JUnit XML result for CI here: a test case per thing judged (a new file unless --force; - for stdout)",
    )
    names = ["--json", "--junit"]
    if html:
        p.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page here")
        names.append("--html")
    p.add_argument("--force", action="store_true", help=f"replace the {'/'.join(names)} files if they exist")
    p.add_argument(
        "--absolute-paths",
        action="store_true",
        help="keep full paths in the reports written (default: a path under the working directory relative to it, "
        "one under your home directory as ~/...)",
    )


def add_json_output(p: argparse.ArgumentParser, what: str) -> None:
    """``--json [FILE]`` and ``--force`` for a command that prints data, not a report (``env``,
    ``watch``): ``--json`` alone, as before, prints it on stdout."""
    _add_json(p, what, bare=True)
    p.add_argument("--force", action="store_true", help="replace the --json file if it exists")


def _add_json(p: argparse.ArgumentParser, what: str, bare: bool = False) -> None:
    p.add_argument(
        "--json",
        metavar="FILE",
        nargs="?" if bare else None,
        const=STDOUT if bare else None,
        help=f"{what} (a new file unless --force; - for stdout, where then only it is printed"
        + (", as --json alone does)" if bare else ")"),
    )


def runs(text: str) -> int:
    """``check --runs K``: at least 2 (there is nothing to compare with one run)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (there is nothing to compare with one run), got {text!r}")
    return value


def factors(text: str) -> list[str]:
    """``drift --vary``: a comma-separated list of known factors, each named once."""
    from ..analysis.drift import BINARY_FACTORS, RANDOM_FACTORS

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


def warm_start(args: argparse.Namespace) -> None:
    """``--warm-from PACK``: what its signer allows, said once, in one ``torchrepro: warning:``
    line, before any rank starts (:func:`torchrepro.cache.policy.warm_start_trust`); a pack the
    ranks may not unpack is kept from them (a cold start, and ``warm_start_skipped`` says why)."""
    if not getattr(args, "warm_from", None):
        return
    from ..cache.policy import warm_start_trust

    trust = warm_start_trust(args.warm_from, args.allow_unsigned)
    if trust.warning:
        print(f"torchrepro: warning: {visible(trust.warning)}", file=sys.stderr, flush=True)
    if not trust.usable:
        args.warm_from, args.warm_start_skipped = None, f"{args.warm_from}: {trust.why}"


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


def add_script(
    p: Parser, *, required: bool = True, script_help: str = "the training script", sides: str | None = None
) -> None:
    """``SCRIPT [ARGS...]`` or ``-m MODULE [ARGS...]``: the training script, or a module run as
    ``python -m`` runs it, and its arguments (see :class:`Parser`). ``sides``: ``compare``'s
    separator of two command lines."""
    p.takes_script, p.sides = True, sides
    p.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE",
        help="MODULE [ARGS...]: run a module as python -m does (its package imported from the working directory) "
        "in place of SCRIPT; what follows it is the module's arguments",
    )
    p.add_argument("script", nargs="?", metavar="SCRIPT", help=script_help)
    more = f", then {sides} B.py and B's arguments" if sides else ""
    p.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help=f"the script's arguments{more}; after a -- they are the script's even where they are torchrepro's "
        "options too",
    )
    p.script_required = required


def add_ranks(p: argparse.ArgumentParser) -> None:
    """How a command launches its runs: ranks, stall timeout, compile-cache policy."""
    p.add_argument(
        "--nproc",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc",
        type=processes,
        default=1,
        metavar="N",
        help="launch N ranks with torchrun (standalone); --nproc-per-node and --nproc_per_node as torchrun spells it",
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
        help="give the ranks one compile-cache directory per node, one shared, or one each (default: inductor's own "
        "directory; per-rank with --warm-from)",
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
