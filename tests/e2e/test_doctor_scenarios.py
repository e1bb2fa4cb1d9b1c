"""Accuracy suite for ``torchrepro doctor``: one real ``torch.compile`` scenario per recompile
trigger and graph-break construct measured in ``FINDINGS.md``, captured in-process with
:class:`CaptureSession`, analysed with :func:`analyse`, and checked against Dynamo's own
bookkeeping for the same run:

* ``compiles``       == the ``get_compilation_metrics()`` records of frames (``co_name`` set)
  without a ``fail_type``, and == ``counters["frames"]["ok"]`` when no frame was skipped
  (``ok`` also counts frames Dynamo inspected and found nothing to compile in: the Python
  code a graph-broken call runs, e.g. ``logging``'s methods; a recompile-limit hit raises inside
  ``convert_frame`` and is counted in ``total`` only);
* ``recompiles``     == compilation-metrics records that carry a ``recompile_reason`` (on torch 2.6,
  which has no such field: whose compile id is not a frame's first) and completed (the limit-hit attempt also carries one, but is not a compile);
* ``unique_graphs``  == ``counters["stats"]["unique_graphs"]``;
* ``graph_breaks``   == ``sum(counters["graph_break"].values())`` plus the
  ``counters["unimplemented"]`` entries other than "Dynamo recompile limit exceeded"
  (data-dependent branching is counted only there).

Each scenario also states what a human expects (the categories of its recompiles in order,
its graph breaks), so a bug shared by Dynamo's counters and torchrepro cannot hide. Only the
``eager`` / ``aot_eager`` backends are used: the suite runs in seconds. See docs/evidence/accuracy.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import clear_compilation_metrics, counters, get_compilation_metrics

from torchrepro.analysis.doctor import analyse  # noqa: E402
from torchrepro.capture.session import CaptureConfig, CaptureSession  # noqa: E402
from torchrepro.eventlog.rundir import load_run  # noqa: E402

THIS_FILE = str(Path(__file__).resolve())
_LOG = logging.getLogger("torchrepro.tests.scenarios")
_SOURCE = Path(__file__).read_text().splitlines()
# Dynamo's per-frame recompile limit: ``recompile_limit`` from torch 2.7, ``cache_size_limit`` before; its
# ``unimplemented`` counter and compilation-metrics failure say "Dynamo recompile limit exceeded" (2.13) or
# "<limit> reached" (2.6)
LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
_LIMIT_GB = re.compile(r"Dynamo recompile limit exceeded|^\w*(recompile|cache_size)_limit reached")
_GB_URL = re.compile(r"/gb/(gb\d+)\.html", re.I)


def _global_state() -> dict:
    return {
        "default_dtype": torch.get_default_dtype(),
        "deterministic": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "num_threads": torch.get_num_threads(),
        "grad_enabled": torch.is_grad_enabled(),
        "recompile_limit": getattr(torch._dynamo.config, LIMIT),
    }


_INITIAL_STATE = _global_state()


def line_of(tag: str) -> int:
    """The line of this file that carries the comment ``# <tag>`` (graph-break locations)."""
    hits = [n for n, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(f"# {tag}")]
    assert len(hits) == 1, f"tag {tag!r} must mark exactly one line, found {hits}"
    return hits[0]


# --- scenarios -----------------------------------------------------------------------------


@dataclass
class Scenario:
    id: str
    body: Callable[[], None]
    categories: list[str] = field(default_factory=list)  # expected category of each recompile, in order
    breaks: list[str] = field(default_factory=list)  # tags of the lines that must graph-break, once per break
    limit_hit: bool = False
    skipped_frames: bool = False  # Python code runs after a graph break: Dynamo inspects and skips it
    uncounted_breaks: int = 0  # graph breaks in none of Dynamo's counters (its structured trace reports them)

    def param(self):
        return pytest.param(self, id=self.id)


def _twice(x):
    return torch.sin(x) * 2 + 1


def s_dtype():
    f = torch.compile(_twice, backend="eager")
    f(torch.ones(4))
    f(torch.ones(4, dtype=torch.float64))
    f(torch.ones(4))  # cached


def s_shape_default():
    f = torch.compile(_twice, backend="eager")
    for n in (4, 5, 6, 7):  # 5 recompiles with the dim marked dynamic; 6 and 7 reuse it
        f(torch.ones(n))


def s_shape_static():
    f = torch.compile(_twice, backend="eager", dynamic=False)
    for n in (4, 5, 6):  # every new shape recompiles
        f(torch.ones(n))


def s_shape_dynamic_0_1():
    f = torch.compile(_twice, backend="eager", dynamic=True)
    f(torch.ones(3))
    f(torch.ones(1))  # 0/1 specialization: size 1 fails the `2 <= size` guard


def s_requires_grad():
    f = torch.compile(_twice, backend="eager")
    f(torch.ones(4))
    f(torch.ones(4, requires_grad=True))


def _grad_mode_fn():
    w = torch.nn.Linear(4, 4)
    return torch.compile(w, backend="eager"), torch.ones(2, 4)


def s_no_grad():
    f, x = _grad_mode_fn()
    f(x)
    with torch.no_grad():
        f(x)


def s_inference_mode():
    f, x = _grad_mode_fn()
    f(x)
    with torch.inference_mode():
        f(torch.ones(2, 4))


def s_autocast():
    f = torch.compile(lambda a, b: a @ b, backend="eager")
    a, b = torch.ones(4, 4), torch.ones(4, 4)
    f(a, b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        f(a, b)
    f(a, b)  # autocast off again: cached


def s_channels_last():
    f = torch.compile(_twice, backend="eager")
    x = torch.ones(2, 3, 4, 5)
    f(x)
    f(x.contiguous(memory_format=torch.channels_last))


def s_transposed():
    f = torch.compile(_twice, backend="eager")
    x = torch.ones(5, 5)
    f(x)
    f(x.t())


def s_python_int():
    f = torch.compile(lambda x, n: x * n, backend="eager")
    for n in (2, 3, 4):  # n becomes dynamic after the second value
        f(torch.ones(4), n)


def s_python_bool():
    @torch.compile(backend="eager")
    def f(x, flag):
        return x + 1 if flag else x - 1

    f(torch.ones(4), True)
    f(torch.ones(4), False)
    f(torch.ones(4), True)  # cached


def s_python_none_then_bool():
    @torch.compile(backend="eager")
    def f(x, flag=None):
        return x - 1 if flag is None else x + 1

    f(torch.ones(4))
    f(torch.ones(4), True)  # torch 2.6 guarded None by identity: read as a value change, not another object


def s_eval_mode():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1))
    f = torch.compile(model, backend="eager")
    x = torch.ones(2, 4)
    f(x)
    model.eval()
    f(x)
    model.train()
    f(x)  # switching back reuses the first graph


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2

    def forward(self, x):
        return x * self.scale


def s_module_int_attribute():
    model = _Scaled()
    f = torch.compile(model, backend="eager")
    for scale in (2, 3, 4):
        model.scale = scale
        f(torch.ones(4))


def _mm(a, b):
    return a @ b


def s_tf32():
    matmul = torch.backends.cuda.matmul
    old = matmul.allow_tf32
    f = torch.compile(_mm, backend="eager")
    a = torch.ones(4, 4)
    try:
        matmul.allow_tf32 = False
        f(a, a)
        matmul.allow_tf32 = True
        f(a, a)
    finally:
        matmul.allow_tf32 = old


def s_deterministic():
    old, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    f = torch.compile(_twice, backend="eager")
    try:
        torch.use_deterministic_algorithms(False)
        f(torch.ones(4))
        torch.use_deterministic_algorithms(True)
        f(torch.ones(4))
    finally:
        torch.use_deterministic_algorithms(old, warn_only=warn_only)


def s_default_dtype():
    old = torch.get_default_dtype()
    f = torch.compile(_twice, backend="eager")
    try:
        f(torch.ones(4, dtype=torch.float32))
        torch.set_default_dtype(torch.float64)
        f(torch.ones(4, dtype=torch.float32))
    finally:
        torch.set_default_dtype(old)


def s_num_threads():
    old = torch.get_num_threads()
    f = torch.compile(_twice, backend="eager")
    try:
        f(torch.ones(4))
        torch.set_num_threads(1 if old != 1 else 2)
        f(torch.ones(4))
    finally:
        torch.set_num_threads(old)


GLOBAL_FLAG = True


def _reads_global(x):
    return x + 1 if GLOBAL_FLAG else x - 1


def s_python_global():
    global GLOBAL_FLAG
    f = torch.compile(_reads_global, backend="eager")
    try:
        GLOBAL_FLAG = True
        f(torch.ones(4))
        GLOBAL_FLAG = False
        f(torch.ones(4))
    finally:
        GLOBAL_FLAG = True


def s_object_identity_function():
    f = torch.compile(lambda fn, x: fn(x) + 1, backend="eager")
    f(torch.sin, torch.ones(4))
    f(torch.cos, torch.ones(4))


def s_object_identity_module():
    f = torch.compile(lambda mod, x: mod(x) + 1, backend="eager")
    f(torch.nn.ReLU(), torch.ones(4))
    f(torch.nn.Tanh(), torch.ones(4))


def s_recompile_limit():
    f = torch.compile(_twice, backend="eager", dynamic=False)
    with torch._dynamo.config.patch(LIMIT, 2):
        for n in (2, 3, 4, 5, 6):  # 2 compiles, then the limit: 4, 5, 6 run eager
            f(torch.ones(n))


def s_clean():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    f = torch.compile(model, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        opt.zero_grad()
        f(torch.ones(3, 8)).sum().backward()
        opt.step()


def s_param_requires_grad():
    model = torch.nn.Linear(4, 4)
    f = torch.compile(model, backend="eager")
    f(torch.ones(2, 4))
    model.weight.requires_grad_(False)  # freezing a parameter after the first call
    f(torch.ones(2, 4))


def s_matmul_precision():
    old = torch.get_float32_matmul_precision()
    f = torch.compile(_mm, backend="eager")
    a = torch.ones(4, 4)
    try:
        torch.set_float32_matmul_precision("highest")
        f(a, a)
        torch.set_float32_matmul_precision("high")
        f(a, a)
    finally:
        torch.set_float32_matmul_precision(old)


def s_list_length():
    f = torch.compile(lambda xs: sum(xs), backend="eager")
    f([torch.ones(2)] * 2)
    f([torch.ones(2)] * 3)


def s_tensor_type():
    f = torch.compile(_twice, backend="eager")
    f(torch.ones(4))
    f(torch.nn.Parameter(torch.ones(4)))  # Tensor -> Parameter: a type guard


class _NamedLikeSymbols(torch.nn.Module):
    """Submodule and argument names that look like Dynamo's size symbols (s0, s1, ...)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.s1 = torch.nn.Dropout(0.1)

    def forward(self, x, s0=True):
        y = self.s1(self.lin(x))
        return y + 1 if s0 else y - 1


def s_symbol_like_names_eval():
    model = _NamedLikeSymbols()
    f = torch.compile(model, backend="eager")
    f(torch.ones(2, 4))
    model.eval()  # guard: self._modules['s1'].training == True
    f(torch.ones(2, 4))


def s_symbol_like_names_arg():
    model = _NamedLikeSymbols().eval()
    f = torch.compile(model, backend="eager")
    f(torch.ones(2, 4), True)
    f(torch.ones(2, 4), False)  # guard: s0 == True


# graph-break constructs (each marked line must be reported with this file and line)


def s_gb_item():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        scale = y.sum().item()  # gb:item
        return y * scale

    f(torch.ones(4))
    f(torch.ones(4))


def s_gb_print():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        print("value")  # gb:print
        return y + 1

    # io.StringIO.write is C code: pytest's capture (Python-level write) would add frames that
    # Dynamo inspects and skips, as in the gb-logging scenario.
    with contextlib.redirect_stdout(io.StringIO()):
        f(torch.ones(4))


def s_gb_data_dependent_if():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        if y.sum() > 0:  # gb:if
            return y + 1
        return y - 1

    f(torch.ones(4))
    f(-torch.ones(4))


def s_gb_nonzero():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        z = y[y > 0]  # gb:nonzero
        return z.sum()

    f(torch.randn(8))


def s_gb_manual_seed():
    state = torch.get_rng_state()

    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        torch.manual_seed(0)  # gb:seed
        return y + torch.rand_like(y)

    try:
        f(torch.ones(4))
    finally:
        torch.set_rng_state(state)


def s_gb_random():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        return y + random.random()  # gb:random

    f(torch.ones(4))


def s_gb_time():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        t = time.time()  # gb:time
        return y + 1, t

    f(torch.ones(4))


def s_gb_tolist():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 0.5
        values = y.tolist()  # gb:tolist
        return y + len(values)

    f(torch.ones(4))


def s_gb_logging():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        _LOG.debug("value %s", 1)  # gb:logging
        return y + 1

    f(torch.ones(4))


def s_gb_rng_state():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        state = torch.get_rng_state()  # gb:rng-state
        return y + 1, state

    f(torch.ones(4))


def _item_helper(y):
    return y.sum().item()  # gb:helper


def s_gb_in_helper():
    @torch.compile(backend="eager")
    def f(x):
        y = x * 2
        return y * _item_helper(y)

    f(torch.ones(4))  # Dynamo counts this break twice: inlining f, then compiling the helper frame


class _Printing(torch.nn.Module):
    def forward(self, x):
        y = x * 2
        print("value")  # gb:module
        return y + 1


def s_gb_in_module():
    f = torch.compile(_Printing(), backend="eager")
    with contextlib.redirect_stdout(io.StringIO()):
        f(torch.ones(4))


def s_gb_with_shape_recompile():
    @torch.compile(backend="eager", dynamic=False)
    def f(x):
        y = x * 2
        print("value")  # gb:recompiled
        return y + 1

    with contextlib.redirect_stdout(io.StringIO()):
        f(torch.ones(3))
        f(torch.ones(4))  # both pieces recompile (f and its resume function), and it breaks again


SCENARIOS = [
    Scenario("dtype", s_dtype, ["dtype"]),
    Scenario("shape-default", s_shape_default, ["shape"]),
    Scenario("shape-dynamic-false", s_shape_static, ["shape", "shape"]),
    Scenario("shape-dynamic-true-0-1", s_shape_dynamic_0_1, ["shape"]),
    Scenario("requires-grad", s_requires_grad, ["requires_grad"]),
    Scenario("no-grad", s_no_grad, ["grad_mode"]),
    Scenario("inference-mode", s_inference_mode, ["grad_mode"]),
    Scenario("autocast", s_autocast, ["autocast"]),
    Scenario("stride-channels-last", s_channels_last, ["stride"]),
    Scenario("stride-transposed", s_transposed, ["stride"]),
    Scenario("python-int-arg", s_python_int, ["python_value"]),
    Scenario("python-bool-arg", s_python_bool, ["python_value"]),
    Scenario("python-none-then-bool", s_python_none_then_bool, ["python_value"]),
    Scenario("model-eval", s_eval_mode, ["module_attribute"]),
    Scenario("module-int-attribute", s_module_int_attribute, ["module_attribute", "module_attribute"]),
    Scenario("tf32", s_tf32, ["global_state"]),
    Scenario("deterministic-algorithms", s_deterministic, ["global_state"]),
    Scenario("set-default-dtype", s_default_dtype, ["global_state"]),
    Scenario("set-num-threads", s_num_threads, ["global_state"]),
    Scenario("python-global", s_python_global, ["python_global"]),
    Scenario("object-identity-function", s_object_identity_function, ["object_identity"]),
    Scenario("object-identity-module", s_object_identity_module, ["object_identity"]),
    Scenario("param-requires-grad", s_param_requires_grad, ["requires_grad"]),
    Scenario("float32-matmul-precision", s_matmul_precision, ["global_state"]),
    Scenario("list-length", s_list_length, ["python_value"]),
    Scenario("tensor-to-parameter-type", s_tensor_type, ["object_identity"]),
    Scenario("submodule-named-s1-eval", s_symbol_like_names_eval, ["module_attribute"]),
    Scenario("bool-arg-named-s0", s_symbol_like_names_arg, ["python_value"]),
    Scenario("recompile-limit", s_recompile_limit, ["shape"], limit_hit=True),
    Scenario("clean-training-loop", s_clean),
    Scenario("gb-item", s_gb_item, breaks=["gb:item"]),
    Scenario("gb-print", s_gb_print, breaks=["gb:print"]),
    Scenario("gb-data-dependent-if", s_gb_data_dependent_if, breaks=["gb:if"]),
    Scenario("gb-nonzero", s_gb_nonzero, breaks=["gb:nonzero"]),
    Scenario("gb-manual-seed", s_gb_manual_seed, breaks=["gb:seed"]),
    Scenario("gb-random", s_gb_random, breaks=["gb:random"]),
    Scenario("gb-time", s_gb_time, breaks=["gb:time"]),
    Scenario("gb-tolist", s_gb_tolist, breaks=["gb:tolist"]),
    Scenario("gb-logging", s_gb_logging, breaks=["gb:logging"], skipped_frames=True),
    Scenario("gb-get-rng-state", s_gb_rng_state, breaks=["gb:rng-state"]),
    Scenario("gb-in-inlined-helper", s_gb_in_helper, breaks=["gb:helper", "gb:helper"]),
    Scenario("gb-in-module-forward", s_gb_in_module, breaks=["gb:module"]),
    Scenario(
        "gb-with-shape-recompile",
        s_gb_with_shape_recompile,
        ["shape", "shape"],
        breaks=["gb:recompiled", "gb:recompiled"],
    ),
]

# What torch 2.6's Dynamo does differently in these scenarios (measured; torchrepro's counts still equal
# Dynamo's): an int attribute of a module becomes dynamic after its second value, freezing a parameter
# adds no guard, the logging call's frames are not inspected, and a data-dependent jump is a graph break
# that no counter holds.
ON_TORCH_2_6 = {
    "module-int-attribute": {"categories": ["module_attribute"]},
    "param-requires-grad": {"categories": []},
    "gb-logging": {"skipped_frames": False},
    "gb-data-dependent-if": {"uncounted_breaks": 1},
}
# torch 2.14's Dynamo traces random.random() (earlier versions break the graph there)
ON_TORCH_2_14 = {"gb-random": {"breaks": []}}
TORCH = tuple(int(n) for n in torch.__version__.split("+")[0].split(".")[:2])
OVERRIDES = ON_TORCH_2_6 if TORCH < (2, 7) else ON_TORCH_2_14 if TORCH >= (2, 14) else {}
SCENARIOS = [dataclasses.replace(s, **OVERRIDES.get(s.id, {})) for s in SCENARIOS]


# --- harness -------------------------------------------------------------------------------


@dataclass
class Outcome:
    report: dict
    counters: dict
    metrics: list
    events: list


def run_scenario(scenario: Scenario, run_dir: Path) -> Outcome:
    torch._dynamo.reset()
    counters.clear()
    clear_compilation_metrics()
    session = CaptureSession(CaptureConfig(run_dir=run_dir))
    session.start()
    try:
        scenario.body()
    finally:
        session.stop(0)
        snapshot = {group: dict(values) for group, values in counters.items()}
        metrics = list(get_compilation_metrics())
        torch._dynamo.reset()
    run = load_run(run_dir)
    return Outcome(
        analyse(run.meta, run.logs, run.problems).to_json(),
        snapshot,
        metrics,
        [e for log in run.logs for e in log.events],
    )


def is_recompile(metrics) -> bool:
    """Whether a compilation-metrics record is a recompile: it carries a ``recompile_reason`` (torch 2.7
    on), else (torch 2.6, no such field) its compile id is a frame's second or later (``0/1``)."""
    if hasattr(metrics, "recompile_reason"):
        return bool(metrics.recompile_reason)
    return bool(metrics.compile_id) and not metrics.compile_id.endswith("/0")


def dynamo_graph_breaks(snapshot: dict) -> dict[str, int]:
    """Dynamo's graph-break counters: ``graph_break`` plus the data-dependent entries that only
    ``unimplemented`` holds (everything there but the recompile-limit record)."""
    out = dict(snapshot.get("graph_break", {}))
    for reason, n in snapshot.get("unimplemented", {}).items():
        if not _LIMIT_GB.search(reason):
            out[reason] = out.get(reason, 0) + n
    return out


@pytest.mark.parametrize("scenario", [s.param() for s in SCENARIOS])
def test_scenario_matches_dynamo(scenario: Scenario, tmp_path: Path) -> None:
    out = run_scenario(scenario, tmp_path / "run")
    c = out.report["compile"]
    frames = out.counters.get("frames", {})
    # Dynamo's per-frame records: a backward compile adds a record without co_name (and the
    # structured trace reports it as bwd_compilation_metrics); a limit hit has a fail_type.
    done = [m for m in out.metrics if m.co_name and not m.fail_type]

    # Counts: torchrepro == Dynamo's counters == compilation metrics.
    assert c["compiles"] == len(done)
    if scenario.skipped_frames:  # frames.ok also counts frames Dynamo looked at and skipped
        assert frames["ok"] > c["compiles"]
    else:
        assert c["compiles"] == frames.get("ok", 0)
    assert c["unique_graphs"] == out.counters.get("stats", {}).get("unique_graphs", 0)
    assert c["recompiles"] == sum(is_recompile(m) for m in done)
    dynamo_breaks = dynamo_graph_breaks(out.counters)
    assert c["graph_breaks"] == sum(dynamo_breaks.values()) + scenario.uncounted_breaks
    assert sum(e["count"] for e in c["graph_break_events"]) == c["graph_breaks"]

    # What a human expects of this scenario.
    assert [e["category"] for e in c["recompile_events"]] == scenario.categories, c["recompile_events"]
    assert c["recompiles"] == len(scenario.categories)
    assert c["recompiles_by_category"] == {k: scenario.categories.count(k) for k in set(scenario.categories)}
    codes = [f["code"] for f in out.report["findings"]]
    for category in set(scenario.categories):
        assert f"RECOMPILE_{category.upper()}" in codes

    # Recompile-limit hits: an error finding, exactly when Dynamo hit the limit.
    limit_records = [m for m in out.metrics if m.fail_type and _LIMIT_GB.search(m.fail_reason or "")]
    limit_findings = [f for f in out.report["findings"] if f["code"] == "RECOMPILE_LIMIT_HIT"]
    assert len(c["recompile_limit_hits"]) == len(limit_records) == len(limit_findings) == int(scenario.limit_hit)
    assert all(f["severity"] == "error" for f in limit_findings)
    if scenario.limit_hit:
        hit = c["recompile_limit_hits"][0]
        assert hit["limit"] == LIMIT
        # torch 2.6 names the tensor by its source (L['x'])
        assert re.fullmatch(
            r"tensor '(x|L\['x'\])' size mismatch at index 0\. expected 3, actual 4", hit["last_reason"]
        )
        assert hit["function"] == "_twice"
        assert hit["file"] == THIS_FILE and hit["line"] == _twice.__code__.co_firstlineno
        assert frames["total"] == frames["ok"] + 1

    # Graph breaks: at the user's line of this file, with Dynamo's GBxxxx id.
    events = c["graph_break_events"]
    reported = [(e["file"], e["line"]) for e in events for _ in range(e["count"])]
    assert sorted(reported) == sorted((THIS_FILE, line_of(t)) for t in scenario.breaks)
    dynamo_ids = sorted({m.group(1).upper() for r in dynamo_breaks for m in [_GB_URL.search(r)] if m})
    assert sorted({e["gb_id"] for e in events if e["gb_id"]}) == dynamo_ids
    for e in events:
        assert e["gb_id"] is None or re.fullmatch(r"GB\d{4}", e["gb_id"])
        assert e["source"] and e["source"] == _SOURCE[e["line"] - 1].strip()
    if scenario.breaks:
        assert "GRAPH_BREAK" in codes
    if not scenario.categories and not scenario.breaks and not scenario.limit_hit:  # no false positives
        assert c["recompiles"] == c["graph_breaks"] == 0
        assert not [f for f in out.report["findings"] if f["code"].startswith(("RECOMPILE", "GRAPH_BREAK"))]
        assert not [f for f in out.report["findings"] if f["severity"] == "error"]


def test_global_state_restored() -> None:
    """The scenarios leave nothing behind that would change later tests (runs last here)."""
    assert _global_state() == _INITIAL_STATE
    assert GLOBAL_FLAG is True
