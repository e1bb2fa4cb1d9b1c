"""The `torchrepro` command: build the parser from the command modules (:mod:`torchrepro.commands`),
dispatch, finish what the command produced, turn user errors into one line.

Exit codes: 0 ok; 1 analysed and fails a budget, hits the recompile limit, or is not
reproducible; 2 usage or input error; 3 the user's script failed; 128+N a signal N to torchrepro
stopped the job (forwarded to all of it); 141 (128 + SIGPIPE) the reader of its output went away
(``torchrepro report RUN | head -1``): it ends quietly, after every file it writes was written.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys

from . import __version__
from .commands import options
from .commands._finish import finish
from .errors import UserError
from .telemetry.otlp import run_with_export
from .render.sanitize import visible


# the sub-commands, in the order --help lists them, and the module of each under torchrepro.commands
# (check, check-resume and diff are one family: they share check's runs and comparison)
COMMANDS = {
    "doctor": "doctor",
    "check": "check",
    "check-resume": "check.resume",
    "compare": "compare",
    "diff": "check.diff",
    "repro": "repro",
    "report": "report",
    "run": "run",
    "cache": "cache",
    "watch": "watch",
    "drift": "drift",
    "golden": "golden",
    "env": "env",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``torchrepro`` parser: one sub-command per command module. Given a sub-command's name,
    only that command's module is imported and registered: every rank of a run starts as
    ``torchrepro run`` and needs no other command's imports (~60 ms of CPU per process)."""
    parser = options.Parser(
        prog="torchrepro",
        description="Reproducible torch.compile training, and why a run is not.",
        epilog="Exit codes: 0 ok, 1 fails a budget or not reproducible, 2 usage/input error, 3 script failed, "
        "128+N stopped by signal N (130 SIGINT, 143 SIGTERM, 129 SIGHUP).",
    )
    parser.add_argument("--version", action="version", version=f"torchrepro {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (torchrepro COMMAND --help: its options)"
    )
    for name in [command] if command in COMMANDS else COMMANDS:
        importlib.import_module(f"{__package__}.commands.{COMMANDS[name]}").add_parser(sub)
    return parser


def _tolerant_streams() -> None:
    """A terminal or pipe that cannot encode some character (PYTHONIOENCODING=ascii) gets an escape, not an error."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _check_torch_logs() -> None:
    """An invalid TORCH_LOGS makes ``import torch`` fail: say so before anything is created."""
    value = os.environ.get("TORCH_LOGS")
    if not value:
        return
    try:
        import torch  # noqa: F401
    except ValueError as exc:
        why = " ".join(str(exc).split("For more info")[0].split())
        raise UserError(f"TORCH_LOGS={value!r}: {why} (TORCH_LOGS=help lists them)") from None


def _closed_pipe_raises() -> None:
    """rich ends the process with exit 1 when the pipe it prints into is closed
    (``Console.on_broken_pipe``, which rich means to be overridden): raise the
    :class:`BrokenPipeError` instead, for :func:`main` to end quietly (:func:`_closed_pipe`)."""
    from rich.console import Console

    def closed(console: Console) -> None:
        raise BrokenPipeError(errno.EPIPE, "the reader of this output went away")

    setattr(Console, "on_broken_pipe", closed)


def _closed_pipe() -> int:
    """The reader of stdout or stderr went away (``| head -1``): nothing more can be said there.
    What is still buffered for a closed stream goes to /dev/null (no complaint at exit); exit
    128 + SIGPIPE, as a program that SIGPIPE had ended."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            except (OSError, ValueError):
                pass
    return 128 + signal.SIGPIPE


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":  # a rank: its capture records how a signal ended it (capture.session)
        return finish(args.func(args), args)
    from .commands.launcher import stop_signals

    _closed_pipe_raises()  # not in a rank: rich is the user's script's there, not ours

    with stop_signals():  # SIGINT, SIGTERM, SIGHUP alike: to the jobs running, else one line and 128 + N
        return finish(args.func(args), args)


def main(argv: list[str] | None = None) -> int:
    """Run ``torchrepro ARGV``; its exit code. Whatever it printed is flushed before it returns:
    a closed pipe is met here, never at the interpreter's exit (:func:`_closed_pipe`)."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        return _closed_pipe()
    return code


def _main(argv: list[str] | None) -> int:
    _tolerant_streams()
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        from .commands.outputs import check_args, stdout_for_document

        check_args(args)
        if getattr(args, "absolute_paths", False):
            from .render.paths import keep_absolute_paths

            keep_absolute_paths()
        options.otlp_endpoint_from_env(args)
        options.warm_start(args)
        _check_torch_logs()
        with stdout_for_document(args):
            return run_with_export(args, _dispatch)
    except UserError as exc:
        print(f"torchrepro: error: {visible(exc)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a full disk or an I/O error wherever it is met: one line too
        from .commands.outputs import disk_error

        if (error := disk_error(exc, args)) is None:
            raise
        print(f"torchrepro: error: {visible(error)}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        print("torchrepro: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
