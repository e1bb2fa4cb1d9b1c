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

A file is never written through a symbolic link: an output that is a link is refused (``--force``
or not), and the atomic write replaces the name itself. A command that writes several files into one
folder (``repro``: ``RUN/repro/`` by default, inside a run directory someone else may have made)
writes them through :func:`output_folder`: the folder must not be a link nor hold one, and each file
is created in it through the folder's descriptor, ``O_NOFOLLOW``, and ``O_EXCL`` unless ``--force``
replaces it (atomically, by ``rename``: a file's other hard links keep their bytes).

>>> check(Path("r.json"), inputs=[Path("train.py")], force=False)  # doctest: +SKIP
>>> write(Path("r.json"), b"{}", inputs=[Path("train.py")], force=False)  # doctest: +SKIP
>>> with output_folder(Path("out"), ["repro.py"], inputs=[Path("run")], force=False) as out:  # doctest: +SKIP
...     out.write("repro.py", b"print(1)")
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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
    if path.is_symlink():
        raise InputError(f"{path} is a symbolic link: torchrepro writes no file through a link (name the file itself)")
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
    """The identities of the files under ``directory`` (a hard link to one of them is that file),
    links not followed; walked without recursion (a run directory from elsewhere may nest deeply)."""
    found, todo = set(), [str(directory)]
    while todo:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    else:
                        st = entry.stat(follow_symlinks=False)
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


class OutputFolder:
    """A folder open for writing new files (:func:`output_folder`): each is created through the
    folder's descriptor, never through a link, never onto an existing file unless ``force``."""

    def __init__(self, path: Path, fd: int, force: bool):
        self.path, self.fd, self.force = path, fd, force

    def write(self, name: str, data: bytes) -> Path:
        """Write ``data`` into the new file ``name`` of the folder: created with ``O_EXCL`` (an
        existing one, checked against the inputs by :func:`output_folder`, is replaced by a rename,
        only with ``force``); a full disk is :class:`InputError` naming the file, nothing partial left."""
        target = self.path / name
        existing = self._existing(name)
        temporary = f".{name}.{os.getpid()}.tmp" if existing else name
        try:
            fd = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=self.fd
            )
        except FileExistsError:
            raise InputError(f"{target} appeared while torchrepro wrote {self.path}: run again") from None
        except OSError as exc:
            raise InputError(cannot_write(target, exc)) from None
        try:
            with os.fdopen(fd, "wb") as fp:
                fp.write(data)
            if existing:
                os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self.fd)
            if isinstance(exc, OSError):
                raise InputError(cannot_write(target, exc)) from None
            raise
        return target

    def _existing(self, name: str) -> bool:
        """Whether ``name`` is in the folder already: :class:`InputError` unless ``force`` and it is a
        regular file."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        target = self.path / name
        if not stat.S_ISREG(st.st_mode):
            raise InputError(
                f"{target} exists and is not a regular file (a link, a folder, a FIFO): remove it or write elsewhere"
            )
        if not self.force:
            raise InputError(f"{target} already exists: choose another --out, or pass --force to replace it")
        return True


@contextlib.contextmanager
def output_folder(path: Path, names: Iterable[str], *, inputs: Iterable[Path], force: bool) -> Iterator[OutputFolder]:
    """The folder ``path`` (created if missing) open for writing the files ``names``
    (:meth:`OutputFolder.write`), checked first as a whole: :class:`InputError` if ``path`` is a
    symbolic link or not a directory, holds a link or anything but regular files and folders,
    is or is inside one of ``inputs``, or holds one of ``names`` already (without ``force``)."""
    path = Path(path)
    inputs = list(inputs)
    if path.is_symlink():
        raise InputError(
            f"{path} is a symbolic link: torchrepro writes into no folder through a link (name the folder itself)"
        )
    names = list(names)
    for name in names:
        _refuse_inputs(path / name, inputs)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileExistsError:
        raise InputError(f"{path} exists and is not a directory: choose another --out") from None
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise InputError(f"{path} is not a directory (a file or a link): choose another --out") from None
        raise InputError(cannot_write(path, exc)) from None
    try:
        folder = OutputFolder(path, fd, force)
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise InputError(f"{path / entry} is a symbolic link: torchrepro writes into no folder that holds one")
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                raise InputError(
                    f"{path / entry} is not a regular file (a FIFO, a device, a socket): torchrepro writes into no folder that holds one"
                )
        for name in names:
            folder._existing(name)
        yield folder
    finally:
        os.close(fd)
