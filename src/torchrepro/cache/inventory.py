"""`torchrepro cache status` and `clear`: what an inductor cache holds, who can write to it, and
what in it can never be hit again."""

from __future__ import annotations

import os
import re
import stat
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import TypedDict

from ..reports.cache_status import CacheStatus, CategoryRow, Permissions, UnreachableGroup
from ..reports.findings import Finding, sort_findings
from ..errors import InputError, UserError
from .layout import CATEGORIES, Entry, current_build, existing_cache_dir, headers_dir, looks_like_cache, scan

STATUS_SCHEMA = "torchrepro.cache-status/1"
# Files a live compile may still be writing are left alone by `clear` until they are this old.
_PARTIAL_GRACE_S = 3600
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _iso(t: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t)) if t is not None else None


class Cleared(TypedDict):
    """What :func:`clear` removed (or, in a dry run, would remove)."""

    path: str
    dry_run: bool
    files: int
    bytes: int
    by_category: dict[str, int]
    probe_bytes: int  # of ``bytes``: torchrepro's own probe graphs (category ``probe``)
    errors: list[str]
    left_alone: list[str]  # links and files inductor does not name as it names its entries


def _categories(entries: list[Entry], now: float) -> dict[str, CategoryRow]:
    out: dict[str, CategoryRow] = {}
    for name in CATEGORIES:
        group = [e for e in entries if e.category == name]
        if not group:
            continue
        oldest, newest = min(e.mtime for e in group), max(e.mtime for e in group)
        row: CategoryRow = {
            "what": CATEGORIES[name],
            "files": len(group),
            "bytes": sum(e.size for e in group),
            "oldest": _iso(oldest),
            "newest": _iso(newest),
            "oldest_age_s": round(now - oldest),
            "newest_age_s": round(now - newest),
            "unreachable": sum(e.unreachable is not None for e in group),
        }
        if name in ("fxgraph", "aotautograd"):  # one key can hold several entries (guards differ)
            row["keys"] = len({e.rel.rsplit("/", 1)[0] for e in group})
        out[name] = row
    return out


def writers(entries: list[Entry]) -> dict[str, dict[str, int]]:
    """How many entries each torch / Python / platform wrote, where the bytes say so."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for e in entries:
        for what, value in e.writer.items():
            out[what][value] += 1
    return {what: dict(counts) for what, counts in sorted(out.items())}


def _unreachable(entries: list[Entry]) -> list[UnreachableGroup]:
    groups: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        if e.unreachable:
            groups[(e.category, e.unreachable)].append(e)
    return [
        {
            "category": cat,
            "why": why,
            "files": len(group),
            "bytes": sum(e.size for e in group),
            "examples": [e.rel for e in group[:3]],
        }
        for (cat, why), group in sorted(groups.items(), key=lambda kv: -len(kv[1]))
    ]


def _writable_dirs(root: Path) -> list[str]:
    """Directories below ``root`` that other users may write to (they could add entries)."""
    from ..host.files import writers

    found = []
    for current, dirs, _ in os.walk(root):  # never follows links
        for name in dirs:
            st = os.lstat(os.path.join(current, name))
            if stat.S_ISDIR(st.st_mode) and (who := writers(st)):
                found.append(f"{Path(current, name).relative_to(root)}/ ({who}-writable)")
    return found


def _permissions(root: Path, entries: list[Entry]) -> Permissions:
    from ..host.files import cache_risks, owner_name

    st = root.stat()
    posix = hasattr(os, "geteuid")
    risks = cache_risks(root) if posix else []
    # Every C++ compile includes the precompiled headers of torch's *default* directory, whatever
    # TORCHINDUCTOR_CACHE_DIR says: whoever can write there can put code into every kernel.
    headers = headers_dir()
    if posix and headers.is_dir() and not headers.resolve().is_relative_to(root.resolve()):
        risks += [f"precompiled headers: {r}" for r in cache_risks(headers.resolve())]
    return {
        "owner": owner_name(st.st_uid),
        "mode": oct(stat.S_IMODE(st.st_mode)),
        "precompiled_headers": str(headers) if headers.is_dir() else None,
        "risks": risks,
        "entries_writable_by_others": [f"{e.rel} ({e.writable_by}-writable)" for e in entries if e.writable_by]
        + (_writable_dirs(root) if posix else []),
        "entries_owned_by_others": [f"{e.rel} (owner {e.foreign_owner})" for e in entries if e.foreign_owner],
    }


def _findings(root: Path, entries: list[Entry], perms: Permissions) -> list[Finding]:
    findings = []
    fix = (
        f"chmod -R go-w {root} (and its parents), or give each user a private cache: "
        "torchrepro.cache.configure() creates its directories with mode 0700"
    )
    if perms["risks"]:
        findings.append(
            Finding(
                "CACHE_WRITABLE_BY_OTHERS", "error", perms["risks"][0], hint=fix, evidence={"risks": perms["risks"]}
            )
        )
    foreign = perms["entries_writable_by_others"] + perms["entries_owned_by_others"]
    if foreign:
        findings.append(
            Finding(
                "CACHE_ENTRIES_WRITABLE_BY_OTHERS",
                "error",
                f"{len(foreign)} cache file(s) or folder(s) can be changed by other users: they could run code in "
                "your job",
                hint=fix,
                evidence={"files": foreign[:20]},
            )
        )
    links = [e.rel for e in entries if e.category == "link"]
    if links:
        findings.append(
            Finding(
                "CACHE_HOLDS_LINKS",
                "warning",
                f"{len(links)} link(s) or special file(s) in the cache: a link can point a kernel load anywhere",
                hint=f"Remove them ({links[0]}); inductor writes regular files only.",
                evidence={"links": links[:20]},
            )
        )
    stale = [e for e in entries if e.unreachable]
    if stale:
        size = sum(e.size for e in stale) / 1e6
        findings.append(
            Finding(
                "CACHE_UNREACHABLE_ENTRIES",
                "info",
                f"{len(stale)} file(s), {size:.1f} MB, can never be hit by this installation: {stale[0].unreachable}",
                hint=f"torchrepro cache clear {root} --stale --yes removes them.",
                evidence={"examples": [f"{e.rel}: {e.unreachable}" for e in stale[:10]]},
            )
        )
    partial = [e.rel for e in entries if e.category == "partial"]
    if partial:
        findings.append(
            Finding(
                "CACHE_PARTIAL_WRITES",
                "info",
                f"{len(partial)} partial write(s): a compile was killed while saving",
                hint="Harmless; torchrepro cache clear removes them once they are an hour old.",
                evidence={"files": partial[:10]},
            )
        )
    if not looks_like_cache(root):
        findings.append(
            Finding(
                "CACHE_NOT_INDUCTOR_LAYOUT",
                "warning",
                f"{root} has no fxgraph/, aotautograd/ or locks/: not an inductor cache (yet)",
                hint="Point TORCHINDUCTOR_CACHE_DIR (or DIR) at the directory inductor writes.",
            )
        )
    return sort_findings(findings)


def status(path: str | os.PathLike[str] | None = None) -> CacheStatus:
    """Inventory of an inductor cache directory: counts, sizes and ages by kind, who wrote the
    entries, what can never be hit again, and who can write to it (schema
    ``torchrepro.cache-status/1``). Never creates the directory; never unpickles an entry.

    >>> report = status("/tmp/torchinductor_alice")  # doctest: +SKIP
    >>> report["categories"]["fxgraph"]["files"], [f["code"] for f in report["findings"]]  # doctest: +SKIP
    (12, ['CACHE_WRITABLE_BY_OTHERS'])
    """
    root, source = existing_cache_dir(path)
    build = current_build()
    entries = scan(root, build)
    perms = _permissions(root, entries)
    triton = os.environ.get("TRITON_CACHE_DIR")
    return {
        "schema": STATUS_SCHEMA,
        "path": str(root),
        "source": source,
        "triton_cache_dir": triton or str(root / "triton"),
        "this_build": build,
        "totals": {
            "files": len(entries),
            "bytes": sum(e.size for e in entries),
            "unreachable_files": sum(e.unreachable is not None for e in entries),
        },
        "categories": _categories(entries, time.time()),
        "written_by": writers(entries),
        "unreachable": _unreachable(entries),
        "permissions": perms,
        "findings": [f.to_json() for f in _findings(root, entries, perms)],
    }


def parse_age(text: str) -> float:
    """Seconds in an age such as ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``, ``"2w"`` (a bare number
    is days).

    >>> parse_age("12h")
    43200.0
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if not m:
        raise UserError(f"cannot read the age {text!r}: use a number with s, m, h, d or w (e.g. 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "d"]


def _deletable(e: Entry, now: float) -> bool:
    if e.category == "partial":
        return now - e.mtime > _PARTIAL_GRACE_S
    return e.category not in ("locks", "link", "other")


def clear(
    path: str | os.PathLike[str] | None = None,
    *,
    older_than: float | None = None,
    stale: bool = False,
    yes: bool = False,
) -> Cleared:
    """Remove cache entries: all of them, those older than ``older_than`` seconds (by when they
    were written), and/or (``stale``) those no current configuration can hit. A dry run unless
    ``yes``. torchrepro's own probe graphs beside inductor's entries (category ``probe``) go with
    them. Locks, links and files that are not named as inductor names its entries are never
    touched: ``left_alone`` lists the latter two.

    >>> clear(older_than=parse_age("30d"))["files"]  # doctest: +SKIP
    42
    """
    root, source = existing_cache_dir(path)
    if not looks_like_cache(root):
        raise InputError(
            f"{root} ({source}) does not look like an inductor cache (no fxgraph/, aotautograd/ or "
            "locks/): refusing to delete anything in it"
        )
    now = time.time()
    entries = scan(root)
    chosen = [
        e
        for e in entries
        if _deletable(e, now) and (older_than is None or now - e.mtime > older_than) and (not stale or e.unreachable)
    ]
    errors: list[str] = []
    result: Cleared = {
        "path": str(root),
        "dry_run": not yes,
        "files": len(chosen),
        "bytes": sum(e.size for e in chosen),
        "by_category": dict(Counter(e.category for e in chosen)),
        "probe_bytes": sum(e.size for e in chosen if e.category == "probe"),
        "errors": errors,
        "left_alone": [e.rel for e in entries if e.category in ("other", "link")],
    }
    if yes:
        for e in chosen:
            try:
                (root / e.rel).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                errors.append(f"{e.rel}: {exc.strerror or exc}")
        _remove_empty_dirs(root, {(root / e.rel).parent for e in chosen})
    return result


def _remove_empty_dirs(root: Path, dirs: set[Path]) -> None:
    """Remove directories emptied by a clear, up to (not including) the top-level ones."""
    for directory in sorted(dirs, key=lambda p: -len(p.parts)):
        while len(directory.relative_to(root).parts) > 1:
            try:
                directory.rmdir()
            except OSError:  # not empty (or already gone)
                break
            directory = directory.parent
