"""Every private torch API torchrepro uses, looked up here and nowhere else.

Each is probed once per process, the first time it is needed, and never earlier: Dynamo and
inductor are not imported for a probe a run does not need (importing them costs about a second,
and fixes inductor's cache directory). What each probe found is kept as a :class:`Probe`; capture
writes every probe as a ``capability`` event (``torch_api.<name>``), so a report can say what could
not be observed on this torch version. A probe that finds nothing gives None, and its caller does
without.

Capture changes torch objects only through :func:`patch`; :func:`undo_patches` (called when
capture stops) puts every original back. Nothing here imports torch at module level.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from . import _state
from .eventlog.events import Capability

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

TRACE_LOGGER = "torch.__trace"

# The torch versions torchrepro is tested on, oldest and newest (`make compat`; `make test` runs the pinned
# 2.13.0): the README's "Needs" line, and what `torchrepro env` compares the installed torch with (by minor
# release: 2.14.2 is inside).
TESTED_TORCH = ("2.6.0", "2.14.1")


def _release(version: str) -> tuple[int, ...]:
    """``"2.14.1+cu130"`` → ``(2, 14)``: a patch release (or pre-release) is tested as its minor release is."""
    return tuple(_leading_int(part) for part in version.split("+", 1)[0].split(".")[:2])


def _leading_int(text: str) -> int:
    """The number ``text`` starts with (``"0rc1"`` → 0, ``"14"`` → 14), 0 when none."""
    digits = re.match(r"\d+", text)
    return int(digits.group()) if digits else 0


def outside_tested_range(version: str) -> str | None:
    """Why torch ``version`` is outside :data:`TESTED_TORCH` (what may be misread), or None when inside."""
    oldest, newest = TESTED_TORCH
    if _release(oldest) <= _release(version) <= _release(newest):
        return None
    side = "older than" if _release(version) < _release(oldest) else "newer than"
    return (
        f"torch {version} is {side} the versions torchrepro is tested on ({oldest} to {newest}): "
        "Dynamo's guard texts, compile metrics and trace records it reads may differ, and reports may miss them"
    )


@dataclass(frozen=True)
class Probe:
    """What one lookup of a private torch API found: ``name`` (torchrepro's), ``where`` (torch's
    private name), whether it is there, what torchrepro cannot do without it, and the names
    expected on it that are missing (a config module without ``fallback_random``)."""

    name: str
    where: str
    available: bool
    lost: str
    missing: tuple[str, ...] = ()

    def event(self) -> Capability:
        """This probe as the event capture writes."""
        if not self.available:
            note = f"{self.where} is not in torch {_torch_version()}: {self.lost}"
        elif self.missing:
            note = f"{self.where} lacks {', '.join(self.missing)} in torch {_torch_version()}: {self.lost}"
        else:
            note = self.where
        return Capability(name=f"torch_api.{self.name}", available=self.available and not self.missing, note=note)


def _torch_version() -> str:
    return str(getattr(sys.modules.get("torch"), "__version__", "?"))


def installed_torch_version() -> str:
    """``torch.__version__`` without importing torch where it is not imported yet (~2 s of CPU a
    process that only launches the script pays otherwise): read from the ``version.py`` of the torch
    ``import torch`` would load (the distribution's metadata lacks the local part, ``+cu124``); else
    (no such file: a source checkout) torch's own."""
    if "torch" not in sys.modules:
        import importlib.util

        try:
            origin = getattr(importlib.util.find_spec("torch"), "origin", None)
            if origin:
                found = _VERSION.search((Path(origin).parent / "version.py").read_text(encoding="utf-8"))
                if found:
                    return found.group(1)
        except (ImportError, ValueError, OSError):
            pass
    import torch

    return torch.__version__


_VERSION = re.compile(r"^__version__ = ['\"]([^'\"]+)['\"]", re.MULTILINE)


_FOUND: dict[str, Any] = {}  # probe name -> what it found: a torch object of any type, or None
_PROBES: dict[str, Probe] = {}


@dataclass
class _Kept:
    """What this module keeps for the life of the process (:func:`torchrepro._state.kept`)."""

    patches: list[Patch] = field(default_factory=list)  # torch objects capture replaced, in order
    probe_watchers: list[Callable[[Probe], None]] = field(default_factory=list)  # watch() callbacks


_KEPT = _state.kept(_Kept)


def _probe(name: str, where: str, lost: str, find: Callable[[], T | None], names: Sequence[str] = ()) -> T | None:
    """The value ``find()`` gives (None when it raises), looked up once; ``names``: attributes
    the value should have (recorded when missing, the value is still given)."""
    if name not in _PROBES:
        try:
            value = find()
        except Exception:  # a private API: moved, renamed, or failing to import in another release
            value = None
        _FOUND[name] = value
        missing = tuple(n for n in names if value is not None and not hasattr(value, n))
        probe = _PROBES[name] = Probe(name, where, value is not None, lost, missing)
        for watcher in list(_KEPT.value.probe_watchers):
            watcher(probe)
    found: T | None = _FOUND[name]  # what find() gave for this name
    return found


def probes() -> list[Probe]:
    """Every probe made in this process so far, in the order they were made."""
    return list(_PROBES.values())


def watch(callback: Callable[[Probe], None]) -> Callable[[], None]:
    """Call ``callback(probe)`` for every probe made so far and each one made later; returns a
    function that stops it."""
    for probe in probes():
        callback(probe)
    watchers = _KEPT.value.probe_watchers
    watchers.append(callback)
    return lambda: watchers.remove(callback) if callback in watchers else None


def _attribute(module: str, *path: str) -> Callable[[], Any]:
    def find() -> Any:
        value: Any = importlib.import_module(module)
        for name in path:
            value = getattr(value, name)
        return value

    return find


# --- the probes ------------------------------------------------------------------------------


def trace_logger() -> logging.Logger | None:
    """PyTorch's structured-trace logger (``torch._logging._internal.trace_log``): every compile,
    recompile reason, graph break and cache lookup is logged there."""

    def find() -> logging.Logger | None:
        logger = _attribute("torch._logging._internal", "trace_log")()
        return logger if logger is logging.getLogger(TRACE_LOGGER) else None

    return _probe("trace_log", "torch._logging._internal.trace_log", "compiles are not observed", find)


def dispatch_mode() -> type | None:
    """``torch.utils._python_dispatch.TorchDispatchMode``: sees every aten op (op replays)."""
    return _probe(
        "dispatch_mode",
        "torch.utils._python_dispatch.TorchDispatchMode",
        "an op replay records no ops",
        _attribute("torch.utils._python_dispatch", "TorchDispatchMode"),
    )


def tree_flatten() -> Callable[[Any], tuple[list[Any], Any]] | None:
    """``torch.utils._pytree.tree_flatten``: the leaves of an op's nested arguments."""
    return _probe(
        "tree_flatten",
        "torch.utils._pytree.tree_flatten",
        "an op replay records no ops",
        _attribute("torch.utils._pytree", "tree_flatten"),
    )


def current_autograd_node() -> Callable[[], Any] | None:
    """``torch._C._current_autograd_node``: the backward node running now (None in forward)."""
    return _probe(
        "autograd_node",
        "torch._C._current_autograd_node",
        "an op replay records no ops",
        _attribute("torch._C", "_current_autograd_node"),
    )


def dataloader_iterator() -> type | None:
    """``torch.utils.data.dataloader._BaseDataLoaderIter``: every DataLoader batch passes its
    ``__next__``."""
    return _probe(
        "dataloader_iterator",
        "torch.utils.data.dataloader._BaseDataLoaderIter",
        "batches are not fingerprinted",
        _attribute("torch.utils.data.dataloader", "_BaseDataLoaderIter"),
    )


def dataloader_get_iterator() -> Callable[[Any], Any] | None:
    """``torch.utils.data.DataLoader._get_iterator``: where a DataLoader starts its worker
    processes (``seed_everything`` seeds each worker there, per rank and epoch)."""
    return _probe(
        "dataloader_get_iterator",
        "torch.utils.data.DataLoader._get_iterator",
        "DataLoader workers are seeded by torch alone, not per rank and epoch",
        _attribute("torch.utils.data", "DataLoader", "_get_iterator"),
    )


def set_dataloader_get_iterator(function: Callable[[Any], Any]) -> None:
    """Make ``function`` the DataLoader's ``_get_iterator`` (the seed plan's wrapper, or the
    original back); the library's own patch, kept while a seed plan is active, not undone with capture."""
    import torch.utils.data

    setattr(torch.utils.data.DataLoader, "_get_iterator", function)  # a method: assigned as a plain attribute


def ops_replay() -> bool:
    """Whether this torch has all an op replay needs (dispatch mode, pytree, autograd node)."""
    return all(probe() is not None for probe in (dispatch_mode, tree_flatten, current_autograd_node))


def compile_fx_module() -> ModuleType | None:
    """``torch._inductor.compile_fx`` (imports inductor), when it has both entry points capture
    wraps: ``compile_fx`` and ``compile_fx_inner``."""

    def find() -> ModuleType | None:
        module = importlib.import_module("torch._inductor.compile_fx")
        return (
            module
            if callable(getattr(module, "compile_fx", None)) and callable(getattr(module, "compile_fx_inner", None))
            else None
        )

    return _probe(
        "compile_fx",
        "torch._inductor.compile_fx.compile_fx/compile_fx_inner",
        "compiled graphs cannot be replayed, nor inductor swapped for aot_eager",
        find,
    )


def wrap_compile_fx(outer: Callable[..., Any]) -> Patch | None:
    """Wrap inductor's entry point ``compile_fx`` (the one wrapper every capture and fix uses): its
    outermost call goes to ``outer(original, gm, example_inputs, *args, **kwargs)``; the calls it
    makes of itself (config patches, inference graphs) go straight to the original. None where
    this torch lacks it (see :func:`compile_fx_module`)."""
    module = compile_fx_module()
    if module is None:
        return None
    original, depth = module.compile_fx, [0]

    def compile_fx(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if depth[0]:
            return original(gm, example_inputs, *args, **kwargs)
        depth[0] += 1
        try:
            return outer(original, gm, example_inputs, *args, **kwargs)
        finally:
            depth[0] -= 1

    return patch(module, "compile_fx", compile_fx)


def current_compile_id() -> Any:
    """The id of the compile running now (``CompileId``, printed ``0/1``), or None: none is
    running, or this torch cannot say (``torch._guards.CompileContext.current_compile_id``)."""
    get = _probe(
        "compile_id",
        "torch._guards.CompileContext.current_compile_id",
        "replayed graphs are not told apart by compile id",
        _attribute("torch._guards", "CompileContext", "current_compile_id"),
    )
    return get() if get is not None else None


def lookup_backend() -> Callable[[str], Any] | None:
    """``torch._dynamo.backends.registry.lookup_backend`` (imports Dynamo)."""
    return _probe(
        "lookup_backend",
        "torch._dynamo.backends.registry.lookup_backend",
        "the aot_eager fix cannot be applied",
        _attribute("torch._dynamo.backends.registry", "lookup_backend"),
    )


def inductor_config(load: bool = True) -> ModuleType | None:
    """``torch._inductor.config``; with ``load=False`` only when something imported it already
    (importing it costs about a second), else None."""
    if not load and "torch._inductor.config" not in sys.modules:
        return None
    return _probe(
        "inductor_config",
        "torch._inductor.config",
        "inductor's determinism switches are not set or read",
        _attribute("torch._inductor.config"),
        names=("fallback_random", "deterministic"),
    )


def dynamo_config() -> ModuleType | None:
    """``torch._dynamo.config`` (imports Dynamo)."""
    return _probe(
        "dynamo_config",
        "torch._dynamo.config",
        "compilation cannot be switched off (--compile-mode eager)",
        _attribute("torch._dynamo.config"),
        names=("disable",),
    )


def functorch_config() -> ModuleType | None:
    """``torch._functorch.config`` (``enable_autograd_cache``)."""
    return _probe(
        "functorch_config",
        "torch._functorch.config",
        "a kernel replay may be served from the AOTAutograd cache",
        _attribute("torch._functorch.config"),
        names=("enable_autograd_cache",),
    )


def aot_cache_loading() -> tuple[type, type[Exception], Callable[[], str], ModuleType, type] | None:
    """What loading a compiled graph from an AOTAutograd cache entry goes through, and what keeps
    the graph for a later load: ``FxGraphCacheLoadable`` (``load``, ``_is_backward``,
    ``fx_graph_cache_info``: the FX graph cache key first), ``FXGraphCacheMiss`` (raised by a load,
    the entry counts as a miss and is compiled again), inductor's ``cache_dir()`` and
    ``torch.fx._graph_pickler`` (``GraphPickler.dumps``/``loads``, ``Options``) and the
    ``FakeTensorMode`` a graph is loaded into."""

    def find() -> tuple[type, type[Exception], Callable[[], str], ModuleType, type]:
        result = importlib.import_module("torch._functorch._aot_autograd.aot_autograd_result")
        cache = importlib.import_module("torch._functorch._aot_autograd.autograd_cache")
        cache_dir = _attribute("torch._inductor.runtime.cache_dir_utils", "cache_dir")()
        pickling = importlib.import_module("torch.fx._graph_pickler")
        loadable = result.FxGraphCacheLoadable
        if not callable(getattr(loadable, "load", None)) or not hasattr(pickling.Options(), "ops_filter"):
            raise AttributeError("FxGraphCacheLoadable.load or GraphPickler's Options.ops_filter")
        fake_mode = _attribute("torch._subclasses.fake_tensor", "FakeTensorMode")()
        return loadable, cache.FXGraphCacheMiss, cache_dir, pickling, fake_mode

    return _probe(
        "aot_cache_loading",
        "torch._functorch._aot_autograd.aot_autograd_result.FxGraphCacheLoadable.load",
        "graphs cannot be probed when served from the AOTAutograd cache: the probe turns that cache off",
        find,
    )


def skip_code() -> Callable[[Any], None] | None:
    """``torch._dynamo.eval_frame.skip_code``: Dynamo skips a code object (capture's wrappers)."""
    return _probe(
        "skip_code",
        "torch._dynamo.eval_frame.skip_code",
        "compile events may name torchrepro's module wrapper",
        _attribute("torch._dynamo.eval_frame", "skip_code"),
    )


def compiler_bisector() -> Any:
    """``torch._inductor.compiler_bisector.CompilerBisector`` (imports inductor): finds the backend,
    subsystem or pass of ``torch.compile`` that makes a test fail (``torchrepro repro --bisect``)."""
    return _probe(
        "compiler_bisector",
        "torch._inductor.compiler_bisector.CompilerBisector",
        "repro --bisect names no backend, subsystem or pass; the inductor switches are tried one by one instead",
        _attribute("torch._inductor.compiler_bisector", "CompilerBisector"),
        names=("do_bisect",),
    )


def dynamo_reset() -> None:
    """``torch._dynamo.reset()``: forget every compiled graph (a bisection compiles afresh each try)."""
    reset = _probe(
        "dynamo_reset", "torch._dynamo.reset", "compiles are not redone", _attribute("torch._dynamo", "reset")
    )
    if reset is not None:
        reset()


def dynamo_counters() -> Mapping[str, Mapping[str, int]]:
    """Dynamo's own counters (``torch._dynamo.utils.counters``); empty while Dynamo is not
    loaded (nothing compiled), never importing it."""
    if "torch._dynamo.utils" not in sys.modules:
        return {}
    return (
        _probe(
            "dynamo_counters",
            "torch._dynamo.utils.counters",
            "no cross-check against Dynamo's counters",
            _attribute("torch._dynamo.utils", "counters"),
        )
        or {}
    )


def foreach_norm(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The norm of each tensor: ``torch._foreach_norm`` (one kernel per device and dtype), else
    one ``torch.linalg.vector_norm`` each."""
    norm: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = _probe(
        "foreach_norm",
        "torch._foreach_norm",
        "gradient norms take one kernel per gradient",
        _attribute("torch", "_foreach_norm"),
    )
    if norm is not None:
        return norm(tensors)
    import torch

    return [torch.linalg.vector_norm(t) for t in tensors]


# --- private attributes of torch objects --------------------------------------------------------
# Read per object, where their absence is ordinary (a module torch.compile did not wrap, an FX
# target that is a plain function): no probe, the fallback is the public value.


def compiled_original(module: Any) -> Any:
    """The module ``torch.compile`` wrapped (``OptimizedModule._orig_mod``, through every layer),
    else ``module`` itself: both have one fingerprint and one set of parameter names."""
    import torch.nn

    while isinstance(getattr(module, "_orig_mod", None), torch.nn.Module):
        module = module._orig_mod
    return module


def op_name(target: Any) -> str | None:
    """An FX target's op name: ``OpOverload._opname`` (``add`` for ``aten.add.Tensor``), else its
    ``__name__``, else None."""
    return getattr(target, "_opname", None) or getattr(target, "__name__", None)


def keep_boxed_call(wrapper: Any, compiled: Any) -> Any:
    """``wrapper`` called as the compiled graph it wraps is: ``_boxed_call`` (AOTAutograd's
    boxed convention, the inputs as one list the callee may free) copied over."""
    wrapper._boxed_call = getattr(compiled, "_boxed_call", False)
    return wrapper


# --- patches ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Patch:
    """``owner.name`` replaced by capture; :meth:`undo` puts the original back."""

    owner: Any
    name: str
    original: Any
    replacement: Any
    done: bool = False

    def undo(self) -> None:
        """Put the original back (once), unless something replaced ours since: theirs stays."""
        patches = _KEPT.value.patches
        if self in patches:
            patches.remove(self)
        if not self.done and getattr(self.owner, self.name, None) is self.replacement:
            setattr(self.owner, self.name, self.original)
        self.done = True


def patch(owner: Any, name: str, replacement: Any) -> Patch:
    """Set ``owner.name = replacement`` until :func:`undo_patches` (or the patch's own undo)."""
    handle = Patch(owner, name, getattr(owner, name), replacement)
    setattr(owner, name, replacement)
    _KEPT.value.patches.append(handle)
    return handle


def undo_patches() -> None:
    """Undo every patch still in place, the latest first."""
    patches = _KEPT.value.patches
    while patches:
        patches[-1].undo()
