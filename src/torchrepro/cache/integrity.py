"""`torchrepro cache verify PACK|DIR`: integrity without unpacking or loading anything.

A pack (or a pack extracted by hand: a directory holding ``torchrepro-pack.json``) is checked
file by file against its manifest. A plain cache directory is checked for what a killed or
tampered-with writer leaves behind: truncated pickles (every entry ends with pickle's STOP
opcode), ``.so`` files shorter than their ELF header says, Python modules that do not parse,
links, and unreadable files.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal, TypedDict

from ..errors import InputError
from .layout import Entry, current_build, existing_cache_dir, scan
from .signing import SIGNATURE, signer
from .archive import (
    MANIFEST,
    PackManifest,
    build_mismatches,
    check_pack,
    kernel_mismatches,
    parse_manifest,
    sha256_file,
    unsafe_name,
)


class _Found(TypedDict):
    """What checking one kind of target found (the keys :class:`Verified` has from it, in its order)."""

    kind: str  # pack | extracted pack | cache directory
    signer: str | None
    signed: bool  # a signature is there (``signer`` None then: it does not verify)
    files: int
    bytes: int
    problems: list[str]


class Verified(TypedDict):
    """What :func:`verify` found: every defect (``problems``), the files checked, who signed, and how
    the build the pack was made with differs from this one."""

    path: str
    kind: str
    signer: str | None
    signed: bool
    files: int
    bytes: int
    problems: list[str]
    built_with: Mapping[str, object]  # the manifest's ``build`` as it says it; empty for a cache directory
    mismatches: list[str]
    kernels_rebuilt: list[str]
    created: str | None


def _elf_truncated(path: Path, size: int) -> bool:
    with open(path, "rb") as fp:
        head = fp.read(64)
    if head[:4] != b"\x7fELF" or len(head) < 52:
        return head[:4] == b"\x7fELF"  # an ELF magic with no room for its header
    order: Literal["little", "big"] = "little" if head[5] == 1 else "big"
    wide = head[4] == 2
    offset = int.from_bytes(head[0x28:0x30] if wide else head[0x20:0x24], order)
    entsize = int.from_bytes(head[0x3A:0x3C] if wide else head[0x2E:0x30], order)
    count = int.from_bytes(head[0x3C:0x3E] if wide else head[0x30:0x32], order)
    return offset + entsize * count > size


def _pickle_truncated(path: Path, size: int) -> bool:
    with open(path, "rb") as fp:
        first = fp.read(1)
        fp.seek(max(size - 1, 0))
        last = fp.read(1)
    return first != b"\x80" or last != b"."


def entry_problem(root: Path, entry: Entry) -> str | None:
    """What is wrong with one cache file, judged from its bytes alone (nothing is loaded)."""
    path = root / entry.rel
    try:
        if entry.category == "link":
            return "a link or special file: a cache holds regular files only"
        if entry.category in ("fxgraph", "aotautograd") and _pickle_truncated(path, entry.size):
            return "truncated or not a pickle (no STOP opcode at the end)"
        if entry.rel.endswith(".so") and _elf_truncated(path, entry.size):
            return "truncated shared object (shorter than its ELF header says)"
        if entry.category == "python":
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"Python module does not parse (line {exc.lineno}): truncated?"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return None


def _verify_extracted(root: Path) -> tuple[PackManifest, _Found]:
    try:
        data = (root / MANIFEST).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {root / MANIFEST}: {exc.strerror or exc}") from None
    manifest = parse_manifest(data, str(root / MANIFEST))
    files = manifest["files"]
    problems: list[str] = []
    total, key = 0, None
    for f in files:
        if problem := unsafe_name(f["path"]):
            problems.append(problem)
            continue
        path = root / f["area"] / f["path"]
        try:
            if path.is_symlink() or sha256_file(path) != f["sha256"]:
                problems.append(f"{f['path']}: content does not match the manifest's sha256")
                continue
        except OSError as exc:
            problems.append(f"{f['path']}: {exc.strerror or exc}")
            continue
        total += f["size"]
    good = len(files) - len(problems)
    signed = os.path.lexists(root / SIGNATURE)
    if signed:
        try:
            key = signer(data, (root / SIGNATURE).read_bytes(), str(root / SIGNATURE))
        except (InputError, OSError) as exc:
            problems.append(str(exc))
    found: _Found = {
        "kind": "extracted pack",
        "signer": key,
        "signed": signed,
        "files": good,
        "bytes": total,
        "problems": problems,
    }
    return manifest, found


def _verify_cache_dir(root: Path) -> _Found:
    entries = scan(root)
    problems = [f"{e.rel}: {why}" for e in entries if (why := entry_problem(root, e))]
    return {
        "kind": "cache directory",
        "signer": None,
        "signed": False,
        "files": len(entries),
        "problems": problems,
        "bytes": sum(e.size for e in entries),
    }


def verify(path: str | os.PathLike[str]) -> Verified:
    """Check a pack, an extracted pack or a cache directory; ``problems`` lists each defect.
    ``signer`` is the fingerprint of the key whose signature matches the manifest (None: unsigned, or
    ``signed`` and the signature does not verify, which is a problem). Whether to trust that key is ``unpack``'s question.

    A pack built for another installation is not a defect: ``mismatches`` says why ``unpack``
    would refuse it, ``kernels_rebuilt`` why its compiled kernels would be rebuilt here.
    :class:`InputError` when ``path`` is missing or not one of these.

    >>> verify("warm.tar")["problems"]  # doctest: +SKIP
    []
    """
    path = Path(path)
    manifest: PackManifest | None = None
    if path.is_dir() and (path / MANIFEST).is_file():
        manifest, found = _verify_extracted(path)
    elif path.is_dir():
        found = _verify_cache_dir(existing_cache_dir(path)[0])
    else:
        check = check_pack(path)
        manifest = check.manifest
        found = {
            "kind": "pack",
            "signer": check.signer,
            "signed": check.signed,
            "files": check.files,
            "bytes": check.bytes,
            "problems": check.problems,
        }
    built: Mapping[str, object] = manifest.get("build", {}) if manifest else {}
    here = current_build()
    return {
        "path": str(path),
        **found,
        "built_with": built,
        "mismatches": build_mismatches(built, here) if built else [],
        "kernels_rebuilt": kernel_mismatches(built, here) if built else [],
        "created": manifest.get("created") if manifest else None,
    }
