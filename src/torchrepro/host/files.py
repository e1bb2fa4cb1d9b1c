"""Files on this machine: who owns a directory and who else may write to it (a compile cache
others can write to can run code in the training job), where inductor keeps its cache by default,
and which version of a distribution is installed. The compile-cache library (``cache/``) and what
``torchrepro env`` collects (``capture/environment.py``) both read them."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import stat
import sys
import tempfile
from pathlib import Path

import torch

from ..eventlog.events import NOT_AVAILABLE

KERNEL_RISK = "anyone who can write there can run code in your training job: compiled kernels are loaded from it"


def dist_version(*names: str) -> str:
    """Installed version of the first distribution found, without importing it."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return NOT_AVAILABLE


def owner_name(uid: int) -> str:
    """The user name of ``uid`` (the number when it has none)."""
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def writers(st: os.stat_result) -> str | None:
    """'world' or 'group NAME' when others may write to a directory; None otherwise.

    A user's private group (named after its owner, no other members) does not count.
    """
    if st.st_mode & stat.S_IWOTH:
        return "world"
    if not st.st_mode & stat.S_IWGRP:
        return None
    try:
        import grp

        group = grp.getgrgid(st.st_gid)
    except (ImportError, KeyError):
        return f"group {st.st_gid}"
    owner = owner_name(st.st_uid)
    if group.gr_name == owner and set(group.gr_mem) <= {owner}:
        return None
    return f"group {group.gr_name}"


def foreign_owner(st: os.stat_result) -> bool:
    """Owned by someone other than this user and root."""
    return st.st_uid not in (0, os.geteuid())


def cache_risks(path: Path) -> list[str]:
    """Why others could put code into `path`: the directory, or a parent up to a sticky one."""
    risks = []
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    if current != path:
        st = current.stat()
        who = writers(st)
        if who:
            risks.append(
                f"{path} does not exist yet and {current} is {who}-writable: another "
                f"user can create it first; {KERNEL_RISK}"
            )
        if st.st_mode & stat.S_ISVTX:
            return risks
    else:
        st = path.stat()
        who = writers(st)
        if who:
            mode = oct(stat.S_IMODE(st.st_mode))
            risks.append(f"{path} is {who}-writable (mode {mode}): {KERNEL_RISK}")
        if foreign_owner(st):
            risks.append(f"{path} is owned by {owner_name(st.st_uid)}: {KERNEL_RISK}")
    for parent in current.parents:
        st = parent.stat()
        if st.st_mode & stat.S_ISVTX:  # e.g. /tmp: others cannot rename or replace our entry
            break
        who = writers(st)
        if who:
            risks.append(f"parent {parent} of {path} is {who}-writable: others can replace the cache; {KERNEL_RISK}")
        if foreign_owner(st):
            risks.append(f"parent {parent} of {path} is owned by {owner_name(st.st_uid)}: {KERNEL_RISK}")
    return risks


def inductor_default_dir() -> tuple[str, str]:
    """Inductor's default cache directory and where that answer came from.

    torch's `cache_dir_utils` needs no more of torch than `torch._environment`, so it is loaded from
    its file: importing `torch._inductor` would cost about a second, and `cache_dir()` creates the
    directory. (torch itself is imported: this module needs it, and so does that file on torch 2.13.)
    """
    module = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    if module is None:
        path = Path(torch.__file__).parent / "_inductor" / "runtime" / "cache_dir_utils.py"
        try:
            spec = importlib.util.spec_from_file_location("_torchrepro_cache_dir_utils", path)
            if spec is not None and spec.loader is not None:  # None: no loader for such a file
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
        except Exception:  # moved in this torch release
            module = None
    if module is not None and hasattr(module, "default_cache_dir"):
        return module.default_cache_dir(), "inductor default"
    user = os.environ.get("USER") or os.environ.get("USERNAME") or "unknown_user"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}"), "guessed default"
