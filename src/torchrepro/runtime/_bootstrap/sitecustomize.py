"""torchrepro's start-up hook, put first on the ``PYTHONPATH`` of every process a captured script
starts (see :mod:`torchrepro.runtime.follow`). Standard library only, and nearly free where capture is
not wanted: without ``TORCHREPRO_FOLLOW`` in the environment it only runs the next
``sitecustomize`` on the path (the user's own, or the distribution's), as Python would have.

With it, a process is a rank from its start when it carries ``RANK`` / ``LOCAL_RANK`` /
``WORLD_SIZE`` values other than those of the captured process it descends from (a launcher set
them: Lightning, torchrun, accelerate), or when it is the one child a launcher such as
``accelerate launch --cpu`` runs the script in (``TORCHREPRO_FOLLOW_CHILD`` names its parent): capture
is installed now, the latter as rank 0. Any other process (DataLoader
workers, compile workers, helper scripts: they inherit their parent's values) only gets a hook
that wraps ``torch.distributed.init_process_group`` if it ever imports torch; capture starts
when it joins a process group. A process ``torch.multiprocessing.spawn`` started for a captured
one (``TORCHREPRO_FOLLOW_SPAWN``, taken out of the environment so that its own children do not
inherit it) is also prepared now, as a torchrun rank is: seeded with ``--seed``.
"""

import os
import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing at every start-up
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))
_C10D = "torch.distributed.distributed_c10d"
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")  # as torchrepro.runtime.follow.RANK_VARS
SPAWN_VAR = "TORCHREPRO_FOLLOW_SPAWN"  # as torchrepro.runtime.follow.SPAWN_VAR
CHILD_VAR = "TORCHREPRO_FOLLOW_CHILD"  # as torchrepro.runtime.follow.CHILD_VAR


def _note(what: str, exc: BaseException) -> None:
    print(f"torchrepro: note: {what} in process {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path``, as if this one were not there."""
    try:  # what importlib.machinery and importlib.util re-export, without importing them (~8 ms)
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder
    except ImportError:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _start_rank() -> "int | None":
    """This process's rank when a launcher gave it one at start, else None."""
    env = os.environ
    own = ":".join(env.get(name, "") for name in RANK_VARS)
    if own == "::" or own == env.get("TORCHREPRO_FOLLOW_SEEN"):
        return None
    if env.get("RANK", "").isdigit():
        return int(env["RANK"])
    node = env.get("GROUP_RANK") or env.get("NODE_RANK") or "0"
    if env.get("LOCAL_RANK", "").isdigit() and node == "0":
        return int(env["LOCAL_RANK"])  # Lightning's children on the first node
    return None  # only the process group will say


class _WatchProcessGroup:
    """Wraps ``init_process_group`` as soon as ``torch.distributed`` defines it, then leaves
    ``sys.meta_path``."""

    def find_spec(
        self, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if name != _C10D:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: "ModuleSpec | None" = find(name, path, target) if find else None
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_hook(module: "ModuleType") -> None:
            exec_module(module)
            try:
                from torchrepro.runtime import follow
            except ImportError:  # another Python or environment: this process cannot be captured
                return
            try:
                follow.hook_process_group()
            except Exception as exc:  # never break the user's import of torch
                _note("capture could not watch torch.distributed", exc)

        spec.loader.exec_module = exec_and_hook  # type: ignore[method-assign]  # the hook: run torch's, then ours
        return spec


def _install() -> None:
    if "TORCHREPRO_FOLLOW" not in os.environ:
        return
    spawned = os.environ.pop(SPAWN_VAR, None) is not None
    # the one child a launcher such as `accelerate launch --cpu` runs the script in (its own children are not)
    launched = os.environ.pop(CHILD_VAR, None) == str(os.getppid())
    rank = _start_rank()
    if rank is None and launched:
        try:
            from torchrepro.runtime import follow

            follow.activate_at_start(0, "launcher_child")
        except Exception as exc:
            _note("capture of the launched script not installed", exc)
        return
    if rank is None:
        sys.meta_path.insert(0, _WatchProcessGroup())
        if spawned:
            try:
                from torchrepro.runtime import follow

                follow.prepare_spawned()
            except Exception as exc:
                _note("the spawned process could not be prepared (seeded)", exc)
        return
    try:
        from torchrepro.runtime import follow

        follow.activate_at_start(rank)
    except Exception as exc:
        _note(f"capture of rank {rank} not installed", exc)


try:
    _chain()
finally:
    _install()
