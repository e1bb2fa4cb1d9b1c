"""What made a report: the command line, the script's git commit, and the versions and
environment fingerprint its ranks recorded. :func:`launch_meta` runs when a run starts (it goes
into ``run.json``); :func:`provenance` reads it back with a rank's header, without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

from .. import __version__
from .events import Header
from .payloads import JsonObject


class _Commit(TypedDict):
    commit: str | None


class ScriptRepository(_Commit, total=False):
    """``run.json``'s ``git``: the commit of the repository holding the script (None: in none), its
    top folder, and whether its tracked files had changes."""

    root: str | None
    dirty: bool


def script_repository(script: Path) -> ScriptRepository:
    """The git commit of the repository holding ``script`` and whether its tree had changes;
    ``{"commit": None}`` when it is in none (or git is not installed)."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(script.resolve().parent), *args],
                check=False,
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return {"commit": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "root": git("rev-parse", "--show-toplevel"), "dirty": bool(status)}


def launch_meta(script: Path | None) -> JsonObject:
    """The command line, working directory, torchrepro version and (given a script) the git
    commit of this invocation: the start of a ``run.json``, which its command adds to."""
    meta: JsonObject = {
        "command": [sys.argv[0], *sys.argv[1:]],
        "cwd": os.getcwd(),
        "torchrepro_version": __version__,
    }
    if script is not None:
        meta["git"] = script_repository(script)
    return meta


def provenance(meta: JsonObject, header: Header | None) -> JsonObject:
    """The report's ``provenance`` section (open JSON there: the report shows it) from ``run.json``
    (``meta``) and a rank's header: what ran, from which commit, with which versions."""
    env = (header.env if header is not None else None) or {}
    versions = env.get("versions", {})
    return {
        "command": meta.get("command") or (list(header.argv) if header is not None else None),
        "cwd": meta.get("cwd"),
        "script": meta.get("script"),
        "args": meta.get("args"),
        "git": meta.get("git"),
        "torchrepro": env.get("torchrepro") or meta.get("torchrepro_version"),
        "torch": versions.get("torch") or meta.get("torch_version"),
        "python": versions.get("python") or meta.get("python_version"),
        "triton": versions.get("triton"),
        "cuda": versions.get("cuda"),
        "platform": env.get("hardware", {}).get("platform"),
        "host": getattr(header, "host", None),
        "env_fingerprint": meta.get("env_fingerprint") or getattr(header, "env_fingerprint", None),
        "started": meta.get("started"),
        "ended": meta.get("ended"),
    }
