"""torchrepro: reproducible torch.compile training, and an exact account of why a run is not.

The public API is imported lazily, so that ``torchrepro.analysis`` and the report code can
read event logs on a machine without torch. Every command is also a function here
(``torchrepro.check``, ``doctor``, ``compare``...: :mod:`torchrepro.commands.api`) returning its
typed report.
"""

from __future__ import annotations

from ._lazy import lazy_api

__version__ = "0.4.0"

_API = {  # name -> the submodule defining it (a submodule's own name: the submodule itself)
    "seed_everything": "seed",
    "SeedPlan": "seed",
    "worker_init_fn": "seed",
    "make_generator": "seed",
    "worker_rng": "seed",
    "RngState": "rng",
    "deterministic": "determinism",
    "audit": "determinism",
    "fingerprint": "digests",
    "fingerprints": "digests",
    "stable_uid": "digests",
    "checkpoint": "checkpoint",
    "rng": "rng",
    "UserError": "errors",
    "log_metric": "runtime.metrics",
    # the commands, each a function returning its typed report (docs/library.md)
    "doctor": "commands.api",
    "check": "commands.api",
    "check_resume": "commands.api",
    "compare": "commands.api",
    "diff": "commands.api",
    "drift": "commands.api",
    "record_golden": "commands.api",
    "check_golden": "commands.api",
    "CompileCache": "commands.api",
}

__all__ = sorted(_API)
__getattr__, __dir__ = lazy_api(__name__, _API, globals())
