"""Candidate fixes for nondeterminism, applied in a child run before the user's script starts
(``torchrepro run --fix NAME``): what ``check``'s fix ladder re-runs the script with.

Each fix changes how the script computes, on purpose; it is only ever applied to the ladder's
own truncated runs, never to the runs being compared. The names and the line a user would write
live in :mod:`torchrepro.analysis.fixes`. Its patches are undone when capture stops
(:func:`torchrepro._compat.undo_patches`).
"""

from __future__ import annotations

from typing import Any

import torch

from .._compat import compile_fx_module, current_compile_id, inductor_config, lookup_backend, patch, wrap_compile_fx


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


def apply_fix(spec: str | None) -> None:
    """Apply the fix ``spec``: ``threads_1``, ``deterministic``, ``fallback_random``, ``aot_eager``
    (every compiled frame) or ``aot_eager:F[,F...]`` (those Dynamo frames only). ``eager`` is the
    launcher's own ``--compile-mode eager``."""
    if not spec:
        return
    name, _, arg = spec.partition(":")
    if name == "threads_1":
        _one_thread()
    elif name == "deterministic":
        _deterministic()
    elif name == "fallback_random":
        _fallback_random()
    elif name == "aot_eager":
        _aot_eager({int(f) for f in arg.split(",") if f.strip().isdigit()} if arg else None)
    else:
        raise ValueError(f"unknown fix {spec!r}")
