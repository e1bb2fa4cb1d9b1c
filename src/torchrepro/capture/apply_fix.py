"""Candidate fixes applied in a child run before the user's script starts (``torchrepro run --fix
SPEC``): what ``check``'s fix ladder (nondeterminism) and ``doctor --fixes`` (recompiles and graph
breaks: Dynamo settings and dynamic dimensions) re-run the script with, without editing it.

Each fix changes how the script computes, on purpose; it is only ever applied to those commands'
own runs, never to the runs being compared. The names and the line a user would write live in
:mod:`torchrepro.analysis.fix_ranking` and :mod:`torchrepro.analysis.compile_fixes`. Its patches are
undone when capture stops (:func:`torchrepro._compat.undo_patches`).
"""

from __future__ import annotations

from typing import Any

import torch

from .._compat import (
    compile_fx_module,
    current_compile_id,
    dynamo_config,
    inductor_config,
    lookup_backend,
    patch,
    wrap_compile_fx,
)

# doctor --fixes: Dynamo settings turned on by name (analysis.compile_fixes names the same ones)
_DYNAMO_SWITCHES = ("capture_scalar_outputs", "capture_dynamic_output_shape_ops", "allow_unspec_int_on_nn_module")
_DYNAMO_LIMITS = ("recompile_limit", "accumulated_recompile_limit")


def _one_thread() -> None:
    """Pin one intra-op thread, also against the script's own ``torch.set_num_threads(n)``."""
    real = torch.set_num_threads
    real(1)

    def set_num_threads(n: int) -> None:  # the script asks for n; the fix keeps 1
        real(1)

    patch(torch, "set_num_threads", set_num_threads)


def _deterministic() -> None:
    from ..determinism import deterministic

    deterministic(compile="native")  # deterministic algorithms + inductor's deterministic mode; kept on


def _fallback_random() -> None:
    config = inductor_config()
    if config is not None:
        patch(config, "fallback_random", True)


def _aot_eager(frames: set[int] | None) -> None:
    """Compile with ``aot_eager`` instead of inductor: the Dynamo frames in ``frames`` (compile ids
    ``F/*``), or every frame when ``frames`` is None. Inductor's entry point is replaced for the
    process (the dynamo inductor backend and torch.compile's inductor wrapper both import it at call
    time); where a frame is not chosen the real inductor runs. Not applied where this torch lacks
    either entry point."""
    found, lookup = compile_fx_module(), lookup_backend()
    if found is None or lookup is None:
        return
    aot_eager = lookup("aot_eager")

    def compile_fx(inductor: Any, gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        frame = getattr(current_compile_id(), "frame_id", None)
        if frames is None or frame in frames:
            return aot_eager(gm, example_inputs)
        return inductor(gm, example_inputs, *args, **kwargs)

    wrap_compile_fx(compile_fx)


def _dynamo(name: str, value: Any) -> None:
    config = dynamo_config()
    if config is not None:
        patch(config, name, value)


def _dynamic_sources(entries: str) -> None:
    """Mark these sources' dimensions dynamic from the first compile (``L['x']:0``, comma
    separated): what ``torch._dynamo.mark_dynamic`` does, applied by name from outside the script."""
    import torch.compiler.config as compiler_config  # public: torch.compiler.config

    patch(compiler_config, "dynamic_sources", entries)


def _apply_one(spec: str) -> None:
    name, _, arg = spec.partition(":")
    if name == "threads_1":
        _one_thread()
    elif name == "deterministic":
        _deterministic()
    elif name == "fallback_random":
        _fallback_random()
    elif name == "aot_eager":
        _aot_eager({int(f) for f in arg.split(",") if f.strip().isdigit()} if arg else None)
    elif name in _DYNAMO_SWITCHES:
        _dynamo(name, True)
    elif name in _DYNAMO_LIMITS and arg.isdigit():
        _dynamo(name, int(arg))
    elif name == "dynamic":  # torch.compile(..., dynamic=True) for every compiled function
        _dynamo("assume_static_by_default", False)
    elif name == "dynamic_sources" and arg:
        _dynamic_sources(arg)
    else:
        raise ValueError(f"unknown fix {spec!r}")


def apply_fix(spec: str | None) -> None:
    """Apply the fix ``spec``: ``threads_1``, ``deterministic``, ``fallback_random``, ``aot_eager``
    (every compiled frame) or ``aot_eager:F[,F...]`` (those Dynamo frames only); for compile
    health, a Dynamo switch turned on (``capture_scalar_outputs``, ``capture_dynamic_output_shape_ops``,
    ``allow_unspec_int_on_nn_module``), a raised limit (``recompile_limit:N``,
    ``accumulated_recompile_limit:N``), ``dynamic`` (every dimension dynamic, as ``dynamic=True``)
    or ``dynamic_sources:L['x']:0[,...]``. Several fixes join with ``+``. ``eager`` is the
    launcher's own ``--compile-mode eager``."""
    if not spec:
        return
    for one in spec.split("+"):
        _apply_one(one)
