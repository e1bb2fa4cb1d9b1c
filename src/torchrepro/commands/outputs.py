"""A command's output files, from its arguments: what it reads (:func:`inputs_of`), what it writes
(``--json``/``--junit``/``--html``), checked before anything runs (:func:`check_args`) and written
through the one output guard (:mod:`torchrepro.eventlog.output_guard`), or to stdout for ``-``
(:func:`stdout_for_document`); a full disk met anywhere as the one line the CLI prints
(:func:`disk_error`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError, UserError
from ..eventlog.rundir import cannot_write
from ..eventlog.output_guard import Replaceable, check, write
from .options import STDOUT

# the arguments of any command that name what it reads (``out``: a drift experiment's, re-read)
INPUT_ARGS = ("script", "run_dir", "run_a", "run_b", "trace", "collect", "source", "headers_from", "golden")
OUTPUT_ARGS = ("json", "junit", "html")


def inputs_of(args: argparse.Namespace) -> list[Path]:
    """What a command reads, from its arguments: every output is compared with these. A stored run
    it reads brings the inputs of that run too (:func:`recorded_inputs`)."""
    names = INPUT_ARGS + (("out",) if getattr(args, "command", None) == "drift" else ())
    named = [Path(v) for v in (getattr(args, name, None) for name in names) if isinstance(v, str) and v]
    return [*named, *(path for directory in named if directory.is_dir() for path in recorded_inputs(directory))]


def recorded_inputs(directory: Path) -> list[Path]:
    """The inputs of the runs stored in ``directory`` (its ``run.json``, its runs' one level down, a
    drift ``plan.json``): each script, and each of its arguments that names an existing file,
    relative to the directory the run was started in."""
    from ..eventlog.rundir import RUN_FILE, read_json_file

    found = []
    for record in (directory / RUN_FILE, *directory.glob(f"*/{RUN_FILE}"), directory / "plan.json"):
        try:
            meta = read_json_file(record) if record.is_file() else None
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        cwd = Path(meta["cwd"]) if isinstance(meta.get("cwd"), str) else Path.cwd()
        args = meta.get("args")
        for value in [meta.get("script"), *(args if isinstance(args, list) else [])]:
            if isinstance(value, str) and value and (cwd / value).is_file():
                found.append(cwd / value)
    return found


def _named(args: argparse.Namespace) -> dict[str, str]:
    """What each of the command's ``--json``/``--junit``/``--html`` names (``-``: stdout)."""
    return {f"--{name}": v for name in OUTPUT_ARGS if isinstance(v := getattr(args, name, None), str) and v}


def outputs_of(args: argparse.Namespace) -> list[Path]:
    """The files a command's ``--json``/``--junit``/``--html`` name (not ``-``, stdout)."""
    return [Path(v) for v in _named(args).values() if v != STDOUT]


def check_args(args: argparse.Namespace) -> None:
    """Refuse a command's ``--json``/``--junit``/``--html`` files before anything runs (:func:`check`);
    two of them naming one file, or both stdout, are refused too."""
    to_stdout = [flag for flag, v in _named(args).items() if v == STDOUT]
    if len(to_stdout) > 1:
        raise UserError(f"{' and '.join(to_stdout)} both name stdout (-): give one of them a file")
    paths, inputs = outputs_of(args), inputs_of(args)
    if len({p.resolve() for p in paths}) < len(paths):
        raise UserError("--json, --junit and --html must name different files")
    for path in paths:
        check(path, inputs=inputs, force=args.force, replaceable=_replaceable(path, args))


def _replaceable(path: Path, args: argparse.Namespace) -> Replaceable | None:
    """An ``--html`` page torchrepro wrote may be replaced without ``--force``."""
    html = getattr(args, "html", None)
    if not isinstance(html, str) or Path(html) != path:
        return None
    from ..render.html import is_torchrepro_html

    return is_torchrepro_html


@contextlib.contextmanager
def stdout_for_document(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json -`` (or ``--junit -``, ``--html -``) stdout carries that document alone: while
    the command runs, everything else it prints (the script's output, progress, the verdict) goes
    to stderr, and :func:`write_args` writes the document to the real stdout."""
    if STDOUT not in _named(args).values():
        yield
        return
    args.document_stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        yield


def write_args(args: argparse.Namespace, path: str, data: bytes) -> None:
    """Write one of a command's ``--json``/``--junit``/``--html`` files (:func:`write`), compared with
    the command's inputs (:func:`inputs_of`); ``-``: to stdout, the bytes as a file would hold them."""
    if path == STDOUT:
        stream = getattr(args, "document_stdout", sys.stdout)
        stream.flush()
        binary = getattr(stream, "buffer", None)
        if binary is None:
            stream.write(data.decode())
        else:
            binary.write(data)
        stream.flush()
        return
    target = Path(path)
    write(target, data, inputs=inputs_of(args), force=args.force, replaceable=_replaceable(target, args))


def disk_error(exc: OSError, args: argparse.Namespace) -> UserError | None:
    """A full disk, a quota or an I/O error met anywhere, as the one line the CLI prints (exit 2),
    naming the file (or, when the error does not say, the directory the command writes into);
    None for other errors (those are bugs: let them show)."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
        return None
    where = exc.filename or getattr(args, "out", None)
    return InputError(cannot_write(Path(where) if isinstance(where, (str, os.PathLike)) else None, exc))
