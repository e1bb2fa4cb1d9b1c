"""What `torchrepro env` shows (drawn by :func:`torchrepro.render.env_text.render_env`): versions,
determinism switches, compile caches, risky variables.

`collect()` gathers plain JSON data and an `env_fingerprint` over everything that changes
numerics or compile-cache keys, so two runs (or two ranks) can be compared by one string.
"""

from __future__ import annotations

import json
import os
import platform
import stat
from dataclasses import asdict, dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TextIO, cast

import torch

from .. import __version__
from .._compat import TESTED_TORCH, outside_tested_range
from ..determinism import CUBLAS_DETERMINISTIC, CUBLAS_VAR, audit
from ..digests import stable_uid
from ..eventlog import stepstream
from ..eventlog.events import NOT_AVAILABLE
from ..host.files import KERNEL_RISK, cache_risks, dist_version, inductor_default_dir, owner_name
from ..eventlog.payloads import CacheDirInfo, EnvInfo, EnvVarInfo, Hardware, SwitchInfo, Threads

__all__ = ["CacheDir", "EnvVar", "collect", "write_json"]


@dataclass
class EnvVar:
    """An environment variable that matters for reproducibility or caching.

    `value` is None where the variable is unset and that itself is worth saying.
    `in_fingerprint` marks variables that change numerics or cache keys.
    """

    name: str
    value: str | None
    note: str
    risky: bool = False
    in_fingerprint: bool = True


@dataclass
class CacheDir:
    """A directory compiled code is loaded from, with who can write to it."""

    name: str
    path: str
    source: str
    exists: bool
    owner: str | None = None
    mode: str | None = None
    note: str = ""
    risks: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- versions


def _nccl_version() -> str:
    try:  # CPU builds have no torch._C._nccl_version
        version = torch.cuda.nccl.version()
    except Exception:
        return NOT_AVAILABLE
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _versions() -> dict[str, str]:
    import numpy

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "torch_git": str(getattr(torch.version, "git_version", NOT_AVAILABLE)),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "numpy": numpy.__version__,
        "cuda": torch.version.cuda or NOT_AVAILABLE,
        "hip": getattr(torch.version, "hip", None) or NOT_AVAILABLE,
        "cudnn": str(cudnn) if cudnn else NOT_AVAILABLE,
        "nccl": _nccl_version(),
        "triton": dist_version("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"),
    }


def _hardware() -> Hardware:
    cpu = getattr(torch.backends, "cpu", None)
    capability = cpu.get_cpu_capability() if cpu is not None and hasattr(cpu, "get_cpu_capability") else NOT_AVAILABLE
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    gpus: list[str] = []
    if torch.cuda.is_available():
        # Reading a name initialises CUDA (a context on the current device, before a torchrun
        # rank has chosen its own): only once the program has done it, else just the count.
        count = torch.cuda.device_count()
        initialised = torch.cuda.is_initialized()
        gpus = [torch.cuda.get_device_name(i) if initialised else "cuda" for i in range(count)]
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(usable) if usable is not None else os.cpu_count(),
        "cpu_capability": capability,
        "gpus": gpus,
    }


# ---------------------------------------------------------------- caches


def _cache_dir(name: str, path: str, source: str, note: str) -> CacheDir:
    real = Path(os.path.realpath(os.path.expanduser(path)))
    entry = CacheDir(name, str(real), source, exists=False, note=note)
    try:
        entry.exists = real.is_dir()
        if real.exists() and not entry.exists:
            entry.risks.append(
                f"{real} exists and is not a directory: compiling fails, or the cache is silently "
                "unused; remove it or point the variable elsewhere"
            )
            return entry
        if entry.exists:
            st = real.stat()
            entry.owner = owner_name(st.st_uid)
            entry.mode = oct(stat.S_IMODE(st.st_mode))
        if hasattr(os, "geteuid"):
            entry.risks = cache_risks(real)
        else:
            entry.note += " (permissions not checked on this platform)"
    except OSError as exc:
        entry.risks.append(f"cannot check {real} ({exc.strerror or exc}): {KERNEL_RISK}")
    return entry


def _caches(triton: str) -> list[CacheDir]:
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    inductor_source = "TORCHINDUCTOR_CACHE_DIR"
    if inductor is None:
        inductor, inductor_source = inductor_default_dir()
    triton_dir = os.environ.get("TRITON_CACHE_DIR")
    triton_source = "TRITON_CACHE_DIR"
    triton_note = "Triton kernels, also those inductor compiles"
    if triton_dir is None:
        home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
        triton_dir, triton_source = os.path.join(home, ".triton", "cache"), "Triton default"
        triton_note = "Triton's own kernels; inductor keeps its Triton kernels in the inductor cache"
    if triton == NOT_AVAILABLE:
        triton_note = "Triton not installed: unused"
    return [
        _cache_dir("inductor", inductor, inductor_source, "FX graph, AOTAutograd and compiled C++/Triton kernels"),
        _cache_dir("triton", triton_dir, triton_source, triton_note),
    ]


# ---------------------------------------------------------------- environment variables


def _always(value: str | None) -> bool:
    return True


def _never(value: str | None) -> bool:
    return False


def _unset(value: str | None) -> bool:
    return value is None


def _on(value: str | None) -> bool:
    return value not in (None, "", "0", "false", "False")


def _omp_unset_note() -> str:
    return (
        f"unset: torch uses this machine's cores ({torch.get_num_threads()} threads); another machine "
        "reduces in another order and misses the inductor cache"
    )


class _Rule(NamedTuple):
    """One row of :data:`_RULES`: the variables it is about (exact names; ``X_*``: every name that
    starts ``X_``), for which values (``when``), whether that value is a risk, what it means (a
    function where the text is computed) and whether it is part of the environment's fingerprint."""

    names: tuple[str, ...]
    when: Callable[[str | None], bool]
    risky: Callable[[str | None], bool]
    note: str | Callable[[], str]
    in_fingerprint: bool = True


_RULES: tuple[_Rule, ...] = (  # the first row that matches a variable and its value decides
    _Rule(
        ("PYTHONHASHSEED",),
        lambda v: v in (None, "random"),
        _always,
        "unset: str hashing and set order vary between processes and ranks; export PYTHONHASHSEED=0 before launching",
    ),
    _Rule(("PYTHONHASHSEED",), _always, _never, "fixed str hashing and set order (not part of inductor's cache key)"),
    _Rule(("OMP_NUM_THREADS",), _unset, _always, _omp_unset_note),
    _Rule(
        ("OMP_NUM_THREADS",),
        _always,
        _never,
        "CPU threads: changes reduction order and inductor's cache key; keep it the same across runs",
    ),
    _Rule(("MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), _always, _never, "BLAS threads: can change reduction order"),
    _Rule(("MKL_CBWR",), _always, _never, "MKL conditional numerical reproducibility: same code path on every CPU"),
    _Rule(
        ("ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE"),
        _always,
        lambda v: (v or "").upper() not in ("", "STRICT"),
        "lets oneDNN compute fp32 in lower precision: numerics change",
    ),
    _Rule(
        (CUBLAS_VAR,),
        _unset,
        _always,
        "unset: cuBLAS may vary run to run; deterministic algorithms raise on cuBLAS ops",
    ),
    _Rule((CUBLAS_VAR,), lambda v: v in CUBLAS_DETERMINISTIC, _never, "fixed cuBLAS workspace: deterministic"),
    _Rule((CUBLAS_VAR,), _always, _always, f"not {' or '.join(CUBLAS_DETERMINISTIC)}: cuBLAS may vary run to run"),
    _Rule(
        ("CUDA_LAUNCH_BLOCKING",),
        _always,
        _on,
        "serialises every kernel launch: much slower, numerics unchanged (usually left over from debugging)",
        in_fingerprint=False,
    ),
    _Rule(("NVIDIA_TF32_OVERRIDE",), _always, _never, "=0 forces TF32 off in cuBLAS/cuDNN, whatever torch's flags say"),
    _Rule(
        ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",), _always, _on, "forces TF32 cuBLAS matmuls on, whatever torch's flags say"
    ),
    _Rule(
        ("CUDA_VISIBLE_DEVICES",),
        _always,
        _never,
        "selects GPUs: another GPU model runs other kernels",
        in_fingerprint=False,
    ),
    _Rule(("RANK", "LOCAL_RANK", "GROUP_RANK"), _always, _never, "this process's rank", in_fingerprint=False),
    _Rule(
        ("WORLD_SIZE", "LOCAL_WORLD_SIZE"),
        _always,
        _never,
        "number of ranks: changes data sharding and all-reduce order",
    ),
    _Rule(("TORCH_LOGS",), _always, _never, "compile logging only", in_fingerprint=False),
    _Rule(
        ("TORCH_TRACE",),
        _always,
        _never,
        "structured compile trace, including your source code, is written here",
        in_fingerprint=False,
    ),
    _Rule(
        ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME"),
        _always,
        _never,
        "compiled kernels are loaded from here (see caches)",
        in_fingerprint=False,
    ),
    _Rule(
        ("TORCHINDUCTOR_FORCE_DISABLE_CACHES",),
        _always,
        _on,
        "every compile is cold (10-20 s on CPU); results do not change",
        in_fingerprint=False,
    ),
    _Rule(
        ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"),
        _always,
        lambda v: v == "0",
        "=0 turns this compile cache off: every compile is cold",
        in_fingerprint=False,
    ),
    _Rule(("TORCHINDUCTOR_DETERMINISTIC",), _always, _never, "=1: inductor makes no timing-driven kernel choices"),
    _Rule(
        ("TORCHINDUCTOR_MAX_AUTOTUNE*", "TORCHINDUCTOR_COORDINATE_DESCENT*"),
        _always,
        _on,
        "kernels chosen by on-device timing may differ between runs unless inductor's deterministic mode is on",
    ),
    _Rule(
        ("TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE"),
        _always,
        _on,
        "torch.compile does nothing: runs eager, whose numerics and RNG differ from compiled runs",
    ),
    _Rule(
        ("TORCH_COMPILE_DEBUG",),
        _always,
        _on,
        "writes debug output for every compile: slow",
        in_fingerprint=False,
    ),
    _Rule(
        ("PYTORCH_TUNABLEOP_ENABLED",),
        _always,
        _on,
        "TunableOp picks GEMM kernels by timing: runs can differ unless its results file is reused",
    ),
    _Rule(("NCCL_ALGO", "NCCL_PROTO"), _always, _never, "pins NCCL's collective algorithm, and so its reduction order"),
    _Rule(("NCCL_*", "TORCH_NCCL_*"), _always, _never, "NCCL transport/debug setting", in_fingerprint=False),
    _Rule(("TORCHINDUCTOR_*",), _always, _never, "inductor setting: part of what is compiled and of its cache key"),
    _Rule(("TORCHDYNAMO_*", "TORCH_COMPILE_*"), _always, _never, "torch.compile setting: can change what is compiled"),
    _Rule(("PYTORCH_TUNABLEOP_*",), _always, _never, "TunableOp setting"),
    _Rule(("*",), _always, _never, "Triton setting"),  # TRITON_*, the last prefix _relevant() admits
)


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(name == p or (p.endswith("*") and name.startswith(p[:-1])) for p in patterns)


def _env_var(name: str, value: str | None) -> EnvVar:
    """Note, risk and fingerprint relevance of one variable (unset only where that matters): the
    first row of :data:`_RULES` for ``name`` whose condition ``value`` meets."""
    rule = next(r for r in _RULES if _matches(name, r.names) and r.when(value))
    note = rule.note if isinstance(rule.note, str) else rule.note()
    return EnvVar(name, value, note, risky=rule.risky(value), in_fingerprint=rule.in_fingerprint)


_NAMES = frozenset(
    {
        "PYTHONHASHSEED",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_CBWR",
        "ONEDNN_DEFAULT_FPMATH_MODE",
        "DNNL_DEFAULT_FPMATH_MODE",
        CUBLAS_VAR,
        "CUDA_LAUNCH_BLOCKING",
        "NVIDIA_TF32_OVERRIDE",
        "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
        "CUDA_VISIBLE_DEVICES",
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "TORCH_LOGS",
        "TORCH_TRACE",
    }
)
_PREFIXES = (
    "TORCHINDUCTOR_",
    "TORCH_COMPILE_",
    "TORCHDYNAMO_",
    "NCCL_",
    "TORCH_NCCL_",
    "TRITON_",
    "PYTORCH_TUNABLEOP_",
)


def _relevant(name: str) -> bool:
    return name in _NAMES or name.startswith(_PREFIXES)


def _env_vars() -> list[EnvVar]:
    names = {n for n in os.environ if _relevant(n)} | {"PYTHONHASHSEED", "OMP_NUM_THREADS"}
    if torch.cuda.is_available():
        names.add(CUBLAS_VAR)
    return [_env_var(n, os.environ.get(n)) for n in sorted(names)]


# ---------------------------------------------------------------- public API


def collect() -> EnvInfo:
    """Everything `torchrepro env` reports, as JSON-ready data.

    Keys: versions, hardware, threads, determinism (see `determinism.audit`), caches,
    env_vars, torch_tested (the tested range of torch versions; ``outside``: why this torch is not in it,
    or None), env_fingerprint (16 hex digits over versions, hardware, threads, determinism
    switches and the variables that change numerics or cache keys; ranks and paths excluded,
    so ranks of one job share it). Takes milliseconds after `import torch`; never initialises
    CUDA (device names only once the program has). Example:
    ``collect()["env_fingerprint"] == other_run["env_fingerprint"]``.
    """
    versions = _versions()
    threads: Threads = {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    switches = audit()
    hardware = _hardware()
    env_vars = _env_vars()
    caches = _caches(versions["triton"])
    for var in env_vars:
        risks = [r for c in caches if var.value and c.source == var.name for r in c.risks]
        if risks:
            var.risky = True
            var.note += f"; {len(risks)} permission risk(s), see caches"
    fingerprinted = {
        "versions": versions,
        "hardware": {k: hardware[k] for k in ("machine", "cpu_capability", "gpus")},
        "threads": threads,
        "determinism": {s.name: s.value for s in switches},
        "env": {v.name: v.value for v in env_vars if v.in_fingerprint},
    }
    return {
        "torchrepro": __version__,
        "versions": versions,
        "hardware": hardware,
        "threads": threads,
        "determinism": [cast(SwitchInfo, asdict(s)) for s in switches],  # the dataclasses' fields, as dicts
        "caches": [cast(CacheDirInfo, asdict(c)) for c in caches],
        "env_vars": [cast(EnvVarInfo, asdict(v)) for v in env_vars],
        "env_fingerprint": stable_uid(fingerprinted)[:16],
        "torch_tested": {"range": list(TESTED_TORCH), "outside": outside_tested_range(torch.__version__)},
        "step_codec": stepstream.CODEC,
    }


def write_json(info: EnvInfo, fp: TextIO) -> None:
    """Write `collect()` output as indented JSON plus a newline.

    Example: ``write_json(collect(), sys.stdout)``.
    """
    json.dump(info, fp, indent=2)
    fp.write("\n")
