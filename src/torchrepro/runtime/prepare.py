"""A process set up before the user's script starts, as its :class:`~torchrepro.runtime.run_options.RunOptions`
say: the compile cache, the compile mode, a candidate fix, the seeds, a drift run's factor levels,
and how a run made only to compare ends.
Run by ``torchrepro run`` (:mod:`torchrepro.commands.launcher`) and in every rank capture follows into
(:mod:`torchrepro.runtime.follow`)."""

from __future__ import annotations

import atexit
import gc
import os
import sys
import warnings

from .run_options import RunOptions


def prepare(options: RunOptions) -> None:
    """Set a process up as ``torchrepro run`` does before capture starts: the cache policy (per
    rank, before any compile), the compile mode, a candidate fix, the seeds, a drift run's factors."""
    from ..capture.apply_fix import apply_fix
    from .factors import apply

    _apply_cache(options)
    apply_compile_mode(options.compile_mode)
    apply_fix(options.fix)  # check's fix ladder: one candidate fix, before the script starts
    if options.seed is not None:
        from ..seed import seed_everything

        seed_everything(options.seed)
    if options.factors is not None:
        apply(options.factors)  # a drift run's factor levels: a seed per stream, threads, backend ...
    if options.analysis_only:
        atexit.register(_collect_then_freeze)  # before the script's own: called after them


def _collect_then_freeze() -> None:
    """A run that ``check``, ``check-resume`` or ``drift`` makes only to compare it ends without the
    interpreter's final garbage collections, each a full pass over the hundreds of thousands of
    objects torch and Dynamo hold (~1 s of CPU at exit in a process that compiled:
    docs/evidence/performance.md). Called after the ``atexit`` calls registered later (the script's own
    where the process is prepared before the script starts; a rank capture follows into is
    prepared as it joins its group): what is garbage then is collected and finalized as usual,
    and every object still alive is frozen (``gc.freeze``), out of reach of those passes. Objects
    are still freed as their last reference goes while modules are torn down; only a reference
    cycle that becomes garbage then is left to the operating system (Python never promised to
    finalize those at exit)."""
    gc.collect()
    gc.freeze()


def _apply_cache(options: RunOptions) -> None:
    """``--cache-policy`` / ``--cache-root`` / ``--warm-from``; without them, the
    ``TORCHREPRO_CACHE_*`` variables a user set (docs/cache.md). What it warns of is said as one
    ``torchrepro: warning:`` line each (the command already said what it knew of the pack's signer)."""
    from ..cache.policy import PREWARM_POLICY, ROOT_VAR, UnverifiedPack, configure, configure_from_env, prewarm

    if options.cache_root:
        os.environ[ROOT_VAR] = options.cache_root  # also where the script's own cache.configure() goes
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", UserWarning)
        warnings.simplefilter("ignore", UnverifiedPack)  # the command said it, once (warm_start_trust)
        if options.warm_from:
            prewarm(options.warm_from, options.cache_policy or PREWARM_POLICY, allow_unsigned=options.allow_unsigned)
        elif options.cache_policy:
            configure(options.cache_policy)
        else:
            configure_from_env()
    for warning in said:
        text = str(warning.message)
        if not text.startswith("torchrepro: "):  # torch's own, as Python shows them
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            continue
        print(f"torchrepro: warning: {text.removeprefix('torchrepro: ').removeprefix('warning: ')}", file=sys.stderr)


def apply_compile_mode(mode: str | None) -> None:
    """``"eager"``: Dynamo off; ``"fallback-random"``: inductor draws random numbers as eager does
    (both undone when capture stops)."""
    from .._compat import dynamo_config, inductor_config, patch

    if mode == "eager" and (config := dynamo_config()) is not None:
        patch(config, "disable", True)
    elif mode == "fallback-random" and (config := inductor_config()) is not None:
        patch(config, "fallback_random", True)
