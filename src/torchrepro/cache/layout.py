"""Where inductor keeps its caches, what each file in them is, and who wrote it.

Inductor's cache directory (torch 2.13) holds ``fxgraph/<k[1:3]>/<key>/<entry>`` (compiled FX
graphs), ``aotautograd/<key>/<entry>`` (AOTAutograd results), ``<2 chars>/<hash>.*`` (generated
Python modules, C++ sources and the ``.so`` kernels built from them, Triton kernels and their
``.best_config`` autotune results), ``triton/<device>/`` (Triton's compiled kernels),
``cache/<system hash>`` (autotune choices, JSON) and ``locks/``; torch's default directory also
holds ``precompiled_headers/``, whatever ``TORCHINDUCTOR_CACHE_DIR`` says. The cache entries are pickles:
nothing here unpickles them. Who wrote an entry is read from plain bytes only: the repro header
inductor stores in an FX-graph entry (``# torch version: ...``), the ELF header and embedded
paths of a ``.so``, the ``system`` record of the autotune cache's JSON.
"""

from __future__ import annotations

import json
import os
import platform
import re
import stat
import subprocess
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import InputError
from ..reports.cache_status import Build

CATEGORIES = {
    "fxgraph": "FX-graph entries",
    "aotautograd": "AOTAutograd entries",
    "cpp": "C++ kernels (.so/.cpp)",
    "python": "generated Python modules",
    "triton": "Triton kernels",
    "autotune": "autotune results",
    "headers": "precompiled C++ headers",
    "locks": "lock files",
    "partial": "partial writes (*.tmp)",
    "link": "links",
    "probe": "torchrepro's probe graphs (check, doctor --probe)",
    "other": "other",
}
# What a warm start needs. Never packed: locks, partial writes, links, and precompiled headers
# (only compiles use them; ~150 MB each, tied to one compiler).
PACKED = ("fxgraph", "aotautograd", "cpp", "python", "triton", "autotune", "probe", "other")
# where torchrepro's graph probe keeps the FX graph of each graph it compiled, beside inductor's
# entries (torchrepro.capture.graph_probe.STORED_GRAPHS; an earlier torchrepro's format under an
# earlier name): one folder of .graph and .json files
PROBE_GRAPHS_PREFIX = "torchrepro-graphs"

_READ_LIMIT = 8 << 20
_CPP_SUFFIXES = (".so", ".cpp", ".o", ".h", ".hpp", ".pyd", ".dylib", ".dll")
_FX_KEY = re.compile(rb"\x8c\x34(f[a-z2-7]{51})")  # a 52-character str in a pickle (SHORT_BINUNICODE)
_TORCH_VERSION = re.compile(rb"# torch version: (\S+)")
_TORCH_CUDA = re.compile(rb"# torch cuda version: (\S+)")
_PY_IN_PATH = re.compile(rb"/python(3\.\d+)/(?:site|dist)-packages/torch/include")
_ELF_MACHINES = {
    3: "i386",
    8: "mips",
    20: "ppc",
    21: "ppc64le",
    40: "arm",
    62: "x86_64",
    183: "aarch64",
    243: "riscv64",
}
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def current_build() -> Build:
    """The torch, Triton, Python and platform this process would compile with.

    >>> current_build()["torch"]  # doctest: +SKIP
    '2.13.0+cpu'
    """
    import torch

    from ..host.files import dist_version
    from ..eventlog.events import NOT_AVAILABLE

    triton = dist_version("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")
    cpu = getattr(torch.backends, "cpu", None)
    return {
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", "")),
        "cuda": torch.version.cuda,
        "triton": None if triton == NOT_AVAILABLE else triton,
        "python": platform.python_version(),
        "system": platform.system(),
        "machine": machine(),
        # part of every C++ kernel's key (its compile command): another value rebuilds the kernels
        "torch_dir": str(Path(torch.__file__).parent),
        "python_include": sysconfig.get_paths().get("include"),
        "cpu_capability": cpu.get_cpu_capability() if cpu is not None and hasattr(cpu, "get_cpu_capability") else None,
        "compiler": _compiler_version(),
    }


def _compiler_version() -> str | None:
    """First line of ``$CXX --version`` (inductor's default compiler is g++)."""
    try:
        proc = subprocess.run([os.environ.get("CXX") or "g++", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.splitlines()[0].strip() if proc.returncode == 0 and proc.stdout else None


def machine() -> str:
    """This machine's CPU architecture, spelled as an ELF header would say it."""
    name = platform.machine().lower()
    return _MACHINE_ALIASES.get(name, name)


def cache_dir(path: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """The inductor cache directory and where that answer came from; never creates it.

    ``path`` if given, else ``TORCHINDUCTOR_CACHE_DIR``, else torch's default (computed the way
    ``torch._inductor.runtime.cache_dir_utils.default_cache_dir`` does, without importing inductor).

    >>> cache_dir()  # doctest: +SKIP
    (PosixPath('/tmp/torchinductor_alice'), 'inductor default')
    """
    if path is not None:
        return Path(path).expanduser().absolute(), "argument"
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).expanduser().absolute(), "TORCHINDUCTOR_CACHE_DIR"
    from ..host.files import inductor_default_dir

    default, source = inductor_default_dir()
    return Path(default).absolute(), source


def headers_dir() -> Path:
    """Where inductor keeps precompiled C++ headers: under torch's *default* cache directory,
    whatever ``TORCHINDUCTOR_CACHE_DIR`` says."""
    from ..host.files import inductor_default_dir

    return Path(inductor_default_dir()[0]).absolute() / "precompiled_headers"


def existing_cache_dir(path: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """Like :func:`cache_dir`, but an :class:`InputError` unless it is a readable directory."""
    root, source = cache_dir(path)
    if not root.exists():
        raise InputError(
            f"no inductor cache at {root} ({source}): nothing has been compiled there yet, "
            "or the cache lives elsewhere (set TORCHINDUCTOR_CACHE_DIR or pass DIR)"
        )
    if not root.is_dir():
        raise InputError(f"{root} ({source}) is not a directory")
    try:
        next(os.scandir(root), None)
    except OSError as exc:
        raise InputError(f"cannot read the cache directory {root}: {exc.strerror or exc}") from None
    return root, source


def looks_like_cache(root: Path) -> bool:
    """Whether ``root`` has the layout of an inductor cache (guards ``clear`` against a wrong DIR)."""
    return any((root / name).is_dir() for name in ("fxgraph", "aotautograd", "locks"))


@dataclass
class Entry:
    """One file in a cache directory: what it is, and what could be read about its writer."""

    rel: str
    category: str
    size: int
    mtime: float
    writable_by: str | None = None  # "world" or "group NAME" when others may replace it
    foreign_owner: str | None = None  # owned by someone other than this user and root
    writer: dict[str, str] = field(default_factory=dict)
    unreachable: str | None = None
    fx_keys: list[str] = field(default_factory=list)  # AOTAutograd entries: the FX graphs they need


def category_of(parts: tuple[str, ...]) -> str:
    """The category of a file from its path parts relative to the cache root."""
    name = parts[-1]
    if name.endswith(".tmp"):
        return "partial"
    top = parts[0]
    if top in ("fxgraph", "aotautograd", "locks", "triton"):
        return top
    if top == "precompiled_headers":  # only in torch's default directory
        return "locks" if len(parts) > 2 and parts[1] == "locks" else "headers"
    if top == "cache":
        return "autotune"
    if top.startswith(PROBE_GRAPHS_PREFIX) and len(parts) == 2 and name.endswith((".graph", ".json")):
        return "probe"
    if len(parts) == 2 and len(top) == 2 and name.split(".", 1)[0][1:3] == top:  # inductor: <h1h2>/<c><h1h2>...
        if name.endswith(".best_config"):
            return "autotune"
        if name.endswith(_CPP_SUFFIXES):
            return "cpp"
        if name.endswith(".py"):
            return "python"
    return "other"


def misplaced(parts: tuple[str, ...], category: str) -> bool:
    """Whether a cache entry sits where inductor would never look for it."""
    if category == "fxgraph":
        return len(parts) != 4 or parts[1] != parts[2][1:3]
    if category == "aotautograd":
        return len(parts) != 3
    return False


def _read(path: Path, limit: int = _READ_LIMIT) -> bytes:
    with open(path, "rb") as fp:
        return fp.read(limit)


def _so_writer(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    if data[:4] == b"\x7fELF" and len(data) >= 20:
        order: Literal["little", "big"] = "little" if data[5] == 1 else "big"
        number = int.from_bytes(data[18:20], order)
        out.update(system="Linux", machine=_ELF_MACHINES.get(number, f"elf-machine-{number}"))
    elif data[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe"):
        out["system"] = "Darwin"
    elif data[:2] == b"MZ":
        out["system"] = "Windows"
    m = _PY_IN_PATH.search(data)
    if m:
        out["python"] = m.group(1).decode()
    return out


def _system_writer(data: bytes) -> dict[str, str]:
    """CUDA/ROCm version and GPU from inductor's local autotune cache (``{"system": ...}``); its
    Triton entry is a key over Triton's sources, not a version, so it is not shown."""
    try:
        system = json.loads(data).get("system") or {}
    except (ValueError, AttributeError):
        return {}
    versions, device = system.get("version") or {}, system.get("device") or {}
    found = {"cuda": versions.get("cuda") or versions.get("hip"), "gpu": device.get("name")}
    return {k: str(v) for k, v in found.items() if v}


def read_entry(root: Path, rel: str, category: str) -> tuple[dict[str, str], list[str]]:
    """What the bytes of one entry say about its writer, and (AOTAutograd) the FX keys it needs.

    Only plain bytes are matched: pickled entries are never loaded.
    """
    path = root / rel
    wanted = {"fxgraph": True, "aotautograd": True, "cpp": rel.endswith(".so"), "autotune": rel.startswith("cache/")}
    if not wanted.get(category):
        return {}, []
    try:
        data = _read(path)
    except OSError:
        return {}, []
    if category == "cpp":
        return _so_writer(data), []
    if category == "autotune":
        return _system_writer(data), []
    if category == "aotautograd":
        return {}, sorted({k.decode() for k in _FX_KEY.findall(data)})
    writer = {}
    if m := _TORCH_VERSION.search(data):
        writer["torch"] = m.group(1).decode(errors="replace")
    if (m := _TORCH_CUDA.search(data)) and m.group(1) != b"None":
        writer["cuda"] = m.group(1).decode(errors="replace")
    return writer, []


def unreachable_reason(entry: Entry, parts: tuple[str, ...], build: Build) -> str | None:
    """Why no process with ``build`` can ever hit this entry, or None."""
    if misplaced(parts, entry.category):
        return "not where inductor looks for it (stale key layout)"
    w = entry.writer
    if w.get("torch") and w["torch"] != build["torch"]:
        return f"written by torch {w['torch']} (this is {build['torch']})"
    if w.get("system") and w["system"] != build["system"]:
        return f"built for {w['system']} (this is {build['system']})"
    if w.get("machine") and w["machine"] != build["machine"]:
        return f"built for {w['machine']} (this is {build['machine']})"
    if w.get("python") and w["python"] != ".".join(build["python"].split(".")[:2]):
        return f"built for Python {w['python']} (this is {build['python']})"
    return None


def walk(root: Path) -> list[tuple[Path, tuple[str, ...], os.stat_result]]:
    """Every file and link below ``root`` (links are not followed), with its stat."""
    found = []
    stack = [root]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError as exc:
            raise InputError(f"cannot read {current}: {exc.strerror or exc}") from None
        for item in entries:
            path = Path(item.path)
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed while we looked (a live job cleaning up)
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
            else:
                found.append((path, path.relative_to(root).parts, st))
    return found


def scan(root: Path, build: Build | None = None) -> list[Entry]:
    """Every entry under ``root``, classified, with writer and reachability where readable."""
    from ..host.files import foreign_owner, owner_name, writers

    build = build or current_build()
    entries = []
    for path, parts, st in walk(root):
        regular = stat.S_ISREG(st.st_mode)
        entry = Entry("/".join(parts), category_of(parts) if regular else "link", st.st_size, st.st_mtime)
        if regular:
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                entry.writable_by = writers(st)
            if hasattr(os, "geteuid") and foreign_owner(st):
                entry.foreign_owner = owner_name(st.st_uid)
            entry.writer, entry.fx_keys = read_entry(root, entry.rel, entry.category)
            entry.unreachable = unreachable_reason(entry, parts, build)
        entries.append(entry)
    _mark_orphans(entries)
    return entries


def _mark_orphans(entries: list[Entry]) -> None:
    """An AOTAutograd entry whose FX graphs are gone or unreachable can never be served."""
    fx: dict[str, str | None] = {}  # FX key -> why it is unreachable (None: some entry of it is fine)
    for e in entries:
        if e.category == "fxgraph" and e.rel.count("/") == 3:
            key = e.rel.split("/")[2]
            if key not in fx or e.unreachable is None:
                fx[key] = e.unreachable
    for e in entries:
        if e.category != "aotautograd" or e.unreachable or not e.fx_keys:
            continue
        missing = [k for k in e.fx_keys if k not in fx]
        stale = [fx[k] for k in e.fx_keys if fx.get(k)]
        if missing:
            e.unreachable = f"needs FX-graph entry {missing[0][:12]}..., which is not in this cache"
        elif stale:
            e.unreachable = f"its FX graphs are unreachable: {stale[0]}"
