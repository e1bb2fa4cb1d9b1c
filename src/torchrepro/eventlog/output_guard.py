"""The one way an output file is written (never onto an input): the guard and the atomic write.

Every file a user names for torchrepro to write (a command's ``--json``, ``--junit``, ``--html``
through :mod:`torchrepro.commands.outputs`; ``cache pack OUT``) is checked by :func:`check` before
anything runs and again by :func:`written` when it is written. The path is resolved (symlinks, ``..``) and compared by identity (device and inode, so a
hard link or a bind mount is seen too) with every input of the command: an output that is an input
(the script, a file of a run directory being read, a plan, a pack) or is inside an input directory
is refused, ``--force`` or not; ``--force`` replaces an earlier output only. The write is atomic
(:func:`~torchrepro.eventlog.rundir.atomic_path`: a temporary file beside it, then ``os.replace``,
the mode of a replaced file kept); a full disk or an I/O error is one line naming the file, with the
partial file removed and the previous one intact.

>>> check(Path("r.json"), inputs=[Path("train.py")], force=False)  # doctest: +SKIP
>>> write(Path("r.json"), b"{}", inputs=[Path("train.py")], force=False)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from ..errors import InputError
from .rundir import atomic_path, cannot_write

Replaceable = Callable[[Path], bool]


def check(path: Path, *, inputs: Iterable[Path], force: bool, replaceable: Replaceable | None = None) -> Path:
    """``path`` if a command may write it: :class:`InputError` if it is a directory, cannot be created
    there (a regular file on the way, a read-only or virtual file system), is or is inside one of
    ``inputs``, or exists and neither ``force`` nor ``replaceable(path)`` says it may be replaced.
    Missing folders are created when it is written."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path} is a directory: name a file to write")
    folder = next(p for p in path.absolute().parents if p.exists())
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file")
        tempfile.TemporaryFile(dir=folder).close()  # the one sure test (root passes access(), /proc refuses)
    except OSError as exc:
        raise InputError(cannot_write(path, exc)) from None
    _refuse_inputs(path, list(inputs))
    if path.exists() and not force:
        if replaceable is None:
            raise InputError(f"{path} already exists: choose another name, or pass --force to replace it")
        if not replaceable(path):
            raise InputError(f"{path} exists and is not a torchrepro report: choose another file, or pass --force")
    return path


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what ``path`` names, links followed; None if nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _refuse_inputs(path: Path, inputs: list[Path]) -> None:
    """:class:`InputError` if ``path`` is one of ``inputs`` or inside one (by resolved path and by
    identity: a symlink, ``..``, a hard link or a bind mount leads to the same file)."""
    inputs = [p for p in inputs if p.exists()]
    folders = {i for p in inputs if p.is_dir() and (i := _identity(p))}
    files = {i for p in inputs if not p.is_dir() and (i := _identity(p))}
    target, own = path.resolve(), _identity(path)
    resolved = [p.resolve() for p in inputs]
    inside = any(target == p or target.is_relative_to(p) for p in resolved)
    inside = inside or any(_identity(parent) in folders for parent in target.parents)
    if own is not None and not inside:
        inside = own in files or any(own in _files_under(p) for p in inputs if p.is_dir())
    if inside:
        raise InputError(f"{path} is an input of this command or inside one: write the output elsewhere")


def _files_under(directory: Path) -> set[tuple[int, int]]:
    """The identities of the files under ``directory`` (a hard link to one of them is that file)."""
    found = set()
    for folder, _, names in os.walk(directory):
        for name in names:
            with contextlib.suppress(OSError):
                st = os.stat(os.path.join(folder, name), follow_symlinks=False)
                found.add((st.st_dev, st.st_ino))
    return found


@contextlib.contextmanager
def written(
    path: Path, *, inputs: Iterable[Path], force: bool, replaceable: Replaceable | None = None
) -> Iterator[Path]:
    """A temporary path for the block to write ``path`` into, after :func:`check` (again: what was
    true before a run may not be after it); it replaces ``path`` only if the block succeeds. An
    ``OSError`` in the block (a full disk) is :class:`InputError` naming ``path``; nothing partial is left."""
    path = check(path, inputs=inputs, force=force, replaceable=replaceable)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            yield tmp
    except OSError as exc:
        raise InputError(cannot_write(path, exc)) from None


def write(
    path: Path, data: bytes, *, inputs: Iterable[Path], force: bool, replaceable: Replaceable | None = None
) -> None:
    """Write ``data`` into the output file ``path`` (:func:`written`)."""
    with written(path, inputs=inputs, force=force, replaceable=replaceable) as tmp:
        tmp.write_bytes(data)
