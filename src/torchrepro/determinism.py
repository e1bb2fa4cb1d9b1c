"""Determinism switches: turn them on (`deterministic`) and see what is really in effect (`audit`).

Every switch here is process-global. Set them before compiling: changing
`torch.use_deterministic_algorithms` later fails dynamo's GLOBAL_STATE guard and
recompiles every compiled function, and inductor reads its config only while it
compiles, so code compiled earlier keeps the old behaviour. In torch 2.13
`use_deterministic_algorithms(mode)` also writes `torch._inductor.config.deterministic = mode`
(and imports inductor), so the two flags move together.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Literal

import torch

from . import _state
from .errors import UserError

__all__ = [
    "CUBLAS_VAR",
    "DeterminismArgumentError",
    "DeterminismWarning",
    "Switch",
    "audit",
    "deterministic",
]

Mode = Literal["strict", "warn"]
CompileMode = Literal["match-eager", "native"]
Scalar = bool | int | str | None

CUBLAS_VAR = "CUBLAS_WORKSPACE_CONFIG"
_CUBLAS_VALUE = ":4096:8"
_CUBLAS_SET_LATE = _state.kept(bool)  # `deterministic` set CUBLAS_VAR after CUDA initialised (too late to count)
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")  # the two values cuBLAS documents as deterministic


class DeterminismArgumentError(UserError, ValueError):
    """An unknown `mode` or `compile` value given to `deterministic`."""


class DeterminismWarning(UserWarning):
    """A determinism setting that cannot take effect in this process."""


def _inductor_config(load: bool) -> ModuleType | None:
    """`torch._inductor.config`, imported only when `load`; None when absent or broken."""
    from ._compat import inductor_config

    return inductor_config(load)


class deterministic:  # noqa: N801  (used like a function, as torch.no_grad is)
    """Turn on every switch that makes (compiled) training repeat bit for bit.

    Sets `CUBLAS_WORKSPACE_CONFIG=:4096:8` when unset, `torch.use_deterministic_algorithms(True,
    warn_only=mode == "warn")`, `cudnn.deterministic=True`, `cudnn.benchmark=False` and inductor's
    `deterministic` (no timing-driven kernel choices, so two runs compile the same kernels). With
    `compile="match-eager"` it also sets inductor's `fallback_random`, so compiled dropout and
    `rand*` use eager's generator and match eager under the same seed; `"native"` leaves inductor's
    own, faster RNG alone. Called plainly the settings stay; as a context manager everything is
    restored on exit (`restore()` does the same by hand). Call it before compiling: inductor reads
    its config at compile time, and changing the deterministic-algorithms flag recompiles every
    compiled function. Example: ``with deterministic(mode="warn"): loss = compiled(x).sum()``.
    """

    def __init__(self, mode: Mode = "strict", compile: CompileMode = "match-eager") -> None:
        if mode not in ("strict", "warn"):
            raise DeterminismArgumentError(f"mode must be 'strict' or 'warn', not {mode!r}")
        if compile not in ("match-eager", "native"):
            raise DeterminismArgumentError(f"compile must be 'match-eager' or 'native', not {compile!r}")
        self.mode = mode
        self.compile = compile
        self._prev_cublas = os.environ.get(CUBLAS_VAR)
        self._prev_algorithms = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        self._prev_cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
        self._inductor = {"deterministic": True}
        if compile == "match-eager":
            self._inductor["fallback_random"] = True
        # Read before use_deterministic_algorithms, which itself sets inductor's `deterministic`
        # in torch 2.13; on releases where it does not, _apply sets it.
        config = _inductor_config(load=True)
        self._prev_inductor = {n: getattr(config, n) for n in self._inductor if hasattr(config, n)}
        if compile == "match-eager" and "fallback_random" not in self._prev_inductor:
            warnings.warn(
                f"torch {torch.__version__} has no torch._inductor.config.fallback_random: "
                "compiled random ops may not match eager",
                DeterminismWarning,
                stacklevel=2,
            )
        self._apply()

    def _apply(self) -> None:
        if self._prev_cublas is None:
            os.environ[CUBLAS_VAR] = _CUBLAS_VALUE
            if torch.cuda.is_initialized():
                _CUBLAS_SET_LATE.value = True
                warnings.warn(
                    f"CUDA is already initialised, so {CUBLAS_VAR}={_CUBLAS_VALUE} may not reach "
                    "cuBLAS; set it in the shell or call deterministic() before any CUDA work",
                    DeterminismWarning,
                    stacklevel=3,
                )
        torch.use_deterministic_algorithms(True, warn_only=self.mode == "warn")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        config = _inductor_config(load=False)
        for name in self._prev_inductor:
            setattr(config, name, self._inductor[name])

    def restore(self) -> None:
        """Put back every setting as it was before this object was created.

        Example: ``d = deterministic(); ...; d.restore()``.
        """
        if self._prev_cublas is None:
            os.environ.pop(CUBLAS_VAR, None)
        else:
            os.environ[CUBLAS_VAR] = self._prev_cublas
        enabled, warn_only = self._prev_algorithms
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = self._prev_cudnn
        config = _inductor_config(load=False)
        for name, value in self._prev_inductor.items():
            setattr(config, name, value)

    def __enter__(self) -> deterministic:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"deterministic(mode={self.mode!r}, compile={self.compile!r})"


@dataclass
class Switch:
    """One setting that decides whether a run repeats, as it stands in this process.

    `value` is the current value (None: unset); `recommended` the value reproducible training
    wants (None: no single right value); `in_effect` whether `value` actually governs this
    process (False e.g. for cuDNN flags without cuDNN); `status` is "ok", "risk" or "info"
    (informational or not applicable here); `note` says why in one line.
    """

    name: str
    value: Scalar
    recommended: Scalar
    in_effect: bool
    status: Literal["ok", "risk", "info"]
    note: str


def _switch(name: str, value: Scalar, recommended: Scalar, note: str, *, applies: bool = True) -> Switch:
    """A Switch whose status follows from `value` versus `recommended`; in effect iff it applies."""
    status: Literal["ok", "risk", "info"]
    if not applies or recommended is None:
        status = "info"
    elif value == recommended:
        status = "ok"
    else:
        status = "risk"
    return Switch(name, value, recommended, applies, status, note)


def _algorithm_switches() -> list[Switch]:
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    off = "no effect while deterministic algorithms are off"
    switches = [
        _switch(
            "torch.use_deterministic_algorithms",
            enabled,
            True,
            "nondeterministic ops use deterministic kernels or refuse to run"
            if enabled
            else "off: ops such as index_add_, scatter_add_ and CUDA pooling backward may vary run to run",
        ),
        _switch(
            "torch.is_deterministic_algorithms_warn_only_enabled()",
            warn_only,
            False,
            off
            if not enabled
            else "warn mode: ops without a deterministic kernel only warn, and still vary"
            if warn_only
            else "ops without a deterministic kernel raise instead of running",
            applies=enabled,
        ),
    ]
    det_utils = getattr(torch.utils, "deterministic", None)
    if det_utils is not None and hasattr(det_utils, "fill_uninitialized_memory"):
        fill = bool(det_utils.fill_uninitialized_memory)
        switches.append(
            _switch(
                "torch.utils.deterministic.fill_uninitialized_memory",
                fill,
                True,
                off
                if not enabled
                else "torch.empty & co. are filled (NaN / max int), so reading them repeats"
                if fill
                else "uninitialised memory is left as is: reading it gives arbitrary values",
                applies=enabled,
            )
        )
    return switches


def _cuda_switches(cuda: bool, cudnn: bool) -> list[Switch]:
    no_cudnn = "" if cudnn else " (no cuDNN here: no effect)"
    cudnn_version = torch.backends.cudnn.version() if cudnn else None
    cublas = os.environ.get(CUBLAS_VAR)
    if not cuda:
        cublas_switch = Switch(CUBLAS_VAR, cublas, _CUBLAS_VALUE, False, "info", "no CUDA: cuBLAS is not used")
    else:
        set_late = _CUBLAS_SET_LATE.value
        ok = cublas in CUBLAS_DETERMINISTIC and not set_late
        if cublas is None:
            note = "unset: cuBLAS may vary run to run; deterministic algorithms then raise"
        elif cublas not in CUBLAS_DETERMINISTIC:
            note = f"not one of {', '.join(CUBLAS_DETERMINISTIC)}: cuBLAS may vary run to run"
        elif set_late:
            note = "set after CUDA was initialised: may not reach cuBLAS"
        elif torch.cuda.is_initialized():
            note = "CUDA already initialised: in effect if it was set before that"
        else:
            note = "set before CUDA initialisation: cuBLAS uses a fixed workspace"
        cublas_switch = Switch(CUBLAS_VAR, cublas, _CUBLAS_VALUE, ok, "ok" if ok else "risk", note)
    tf32_note = "TF32 repeats on one GPU model but rounds unlike fp32 and differs across GPU generations"
    return [
        _switch(
            "cuDNN available",
            cudnn,
            None,
            f"cuDNN {cudnn_version}" if cudnn else "not available: cuDNN switches have no effect",
        ),
        _switch(
            "torch.backends.cudnn.deterministic",
            torch.backends.cudnn.deterministic,
            True,
            "cuDNN picks deterministic convolution algorithms" + no_cudnn,
            applies=cudnn,
        ),
        _switch(
            "torch.backends.cudnn.benchmark",
            torch.backends.cudnn.benchmark,
            False,
            "benchmark chooses convolution algorithms by timing, which can differ between runs" + no_cudnn,
            applies=cudnn,
        ),
        cublas_switch,
        _switch(
            "torch.backends.cuda.matmul.allow_tf32",
            torch.backends.cuda.matmul.allow_tf32,
            False,
            tf32_note if cuda else "no CUDA: no effect",
            applies=cuda,
        ),
        _switch(
            "torch.backends.cudnn.allow_tf32",
            torch.backends.cudnn.allow_tf32,
            False,
            tf32_note + no_cudnn,
            applies=cuda and cudnn,
        ),
    ]


def _cpu_switches() -> list[Switch]:
    omp = os.environ.get("OMP_NUM_THREADS")
    threads = torch.get_num_threads()
    if not omp:
        pinned = "OMP_NUM_THREADS unset: follows this machine's cores"
    elif omp == str(threads):
        pinned = f"pinned by OMP_NUM_THREADS={omp}"
    else:
        pinned = f"OMP_NUM_THREADS={omp}, yet torch uses {threads} (capped, or set in code)"
    precision = torch.get_float32_matmul_precision()
    return [
        _switch(
            "torch.get_float32_matmul_precision()",
            precision,
            "highest",
            "fp32 matmuls in full fp32"
            if precision == "highest"
            else f"{precision!r} lets matmuls use TF32/bf16 internally: numerics change",
        ),
        _switch(
            "torch.get_num_threads()",
            threads,
            None,
            f"CPU reduction order and inductor's cache key depend on it; {pinned}",
        ),
        _switch(
            "torch.get_num_interop_threads()",
            torch.get_num_interop_threads(),
            None,
            "threads running independent ops; does not change numerics",
        ),
    ]


def _inductor_switches() -> list[Switch]:
    config = _inductor_config(load=False)
    # Not imported yet (nothing compiled in this process, e.g. `torchrepro env`): importing it
    # would cost about a second, so report the defaults every compile here will start from.
    loaded = config is not None
    fallback = bool(getattr(config, "fallback_random", False)) if loaded else False
    det_default = os.environ.get("TORCHINDUCTOR_DETERMINISTIC") == "1"
    det = bool(getattr(config, "deterministic", det_default)) if loaded else det_default
    where = "" if loaded else " (inductor not loaded yet: its default)"
    return [
        _switch(
            "torch._inductor.config.fallback_random",
            fallback,
            True,
            (
                "compiled dropout/rand use eager's generator: compiled equals eager"
                if fallback
                else "inductor's own RNG: compiled dropout/rand differ from eager under the same seed"
            )
            + where,
        ),
        _switch(
            "torch._inductor.config.deterministic",
            det,
            True,
            (
                "no timing-driven kernel choices: runs compile the same kernels"
                if det
                else "autotuning/padding chosen by on-device timing may differ between runs (GPU)"
            )
            + where,
        ),
    ]


def _hash_seed_switch() -> Switch:
    seed = os.environ.get("PYTHONHASHSEED")
    fixed = seed is not None and seed != "random"
    # sys.flags.hash_randomization is 0 only for PYTHONHASHSEED=0 taken at start-up.
    in_effect = fixed and (seed != "0" or sys.flags.hash_randomization == 0)
    if not fixed:
        note = "unset: str hashes and set order vary between processes (and ranks)"
    elif not in_effect:
        note = "set after the interpreter started: not in effect"
    else:
        note = "fixed str hashing and set order across processes (not part of cache keys)"
    return Switch("PYTHONHASHSEED", seed, "any fixed integer", in_effect, "ok" if in_effect else "risk", note)


def audit() -> list[Switch]:
    """What actually governs reproducibility in this process, one `Switch` per setting.

    Covers deterministic algorithms, cuDNN, cuBLAS workspace, TF32 and matmul precision,
    thread counts, inductor's RNG and deterministic mode, and PYTHONHASHSEED. It never
    initialises CUDA and does not import inductor (if inductor is not loaded yet, its
    defaults are reported). Example: ``[s.name for s in audit() if s.status == "risk"]``.
    """
    cuda = torch.cuda.is_available()
    cudnn = cuda and torch.backends.cudnn.is_available()
    return [
        *_algorithm_switches(),
        *_cuda_switches(cuda, cudnn),
        *_cpu_switches(),
        *_inductor_switches(),
        _hash_seed_switch(),
    ]
