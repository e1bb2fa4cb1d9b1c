"""The one probe of private torch APIs (``torchrepro._compat``): each is found on this torch, looked
up once, written as a capability event, and every patch capture installs is undone when it stops.
Also: the event log keeps what torch said (recompile reasons, no category), and a log written
with categories in it analyses as before; what torch 2.6 to 2.14 say differently (guard texts, the
recompile limit's names) is read the same way; ``torchrepro env`` says when torch is outside the
tested range."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch._functorch.config

from torchrepro import _compat
from torchrepro.analysis.categories import category_of
from torchrepro.analysis.doctor import analyse
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import Capability, Compile
from torchrepro.eventlog.rundir import load_run
from torchrepro.eventlog.structured_trace import TraceTranslator, constant_ids

from synthetic_runs import rank_events

# every probe torchrepro has, and how to make it (those needing inductor import it)
PROBES = {
    "trace_log": _compat.trace_logger,
    "dispatch_mode": _compat.dispatch_mode,
    "tree_flatten": _compat.tree_flatten,
    "autograd_node": _compat.current_autograd_node,
    "compile_fx": _compat.compile_fx_module,
    "compile_id": _compat.current_compile_id,
    "lookup_backend": _compat.lookup_backend,
    "inductor_config": _compat.inductor_config,
    "dynamo_config": _compat.dynamo_config,
    "functorch_config": _compat.functorch_config,
    "aot_cache_loading": _compat.aot_cache_loading,
    "skip_code": _compat.skip_code,
    "dynamo_counters": _compat.dynamo_counters,
    "dataloader_iterator": _compat.dataloader_iterator,
    "foreach_norm": lambda: _compat.foreach_norm([torch.ones(2)]),
}


# what the oldest torch tested lacks (docs/evidence/compat.md): inductor's `deterministic` switch, and the
# loading of AOTAutograd cache entries (a cache off by default there: every graph is compiled)
BEFORE_2_7 = tuple(int(n) for n in torch.__version__.split("+")[0].split(".")[:2]) < (2, 7)
MISSING = {"inductor_config": ("deterministic",)} if BEFORE_2_7 else {}
ABSENT = {"aot_cache_loading"} if BEFORE_2_7 else set()


def test_every_private_api_is_found_on_this_torch():
    for make in PROBES.values():
        make()
    probes = {p.name: p for p in _compat.probes()}
    assert set(PROBES) <= set(probes)
    missing = MISSING
    for name in PROBES:
        probe = probes[name]
        if name in ABSENT:
            assert not probe.available and not probe.event().available and probe.lost, probe
            continue
        assert probe.available and probe.missing == missing.get(name, ()), probe
        event = probe.event()
        if name in missing:
            assert not event.available and f"lacks {', '.join(missing[name])}" in event.note
        else:
            assert (event.name, event.available, event.note) == (f"torch_api.{name}", True, probe.where)
    assert _compat.trace_logger() is logging.getLogger("torch.__trace")
    assert _compat.ops_replay()
    assert torch.equal(torch.stack(_compat.foreach_norm([torch.ones(4), torch.zeros(3)])), torch.tensor([2.0, 0.0]))


@pytest.fixture
def made_up_probes():
    """Probes this test makes up are forgotten after it (later captures in this process would report them)."""
    yield
    for name in ("test_missing", "test_names"):
        _compat._PROBES.pop(name, None)
        _compat._FOUND.pop(name, None)


def test_a_missing_api_is_looked_up_once_and_said_with_what_is_lost(made_up_probes):
    looked, heard = [], []

    def find():
        looked.append(1)
        return torch.no_such_private_api  # AttributeError, as on a torch that moved it

    stop = _compat.watch(heard.append)
    try:
        assert _compat._probe("test_missing", "torch.no_such_private_api", "nothing is lost", find) is None
        assert _compat._probe("test_missing", "torch.no_such_private_api", "nothing is lost", find) is None
    finally:
        stop()
    assert looked == [1]
    assert [p.name for p in heard if p.name == "test_missing"] == ["test_missing"]
    event = heard[-1].event()
    assert event.available is False and event.name == "torch_api.test_missing"
    assert event.note == f"torch.no_such_private_api is not in torch {torch.__version__}: nothing is lost"
    config = _compat._probe("test_names", "torch.nn", "some names", lambda: torch.nn, names=("Linear", "NoSuch"))
    assert config is torch.nn
    names = next(p for p in _compat.probes() if p.name == "test_names")
    assert names.missing == ("NoSuch",) and names.event().available is False and "lacks NoSuch" in names.event().note


def test_a_patch_is_undone_unless_something_replaced_it_since():
    class Owner:
        value = "original"

    first = _compat.patch(Owner, "value", "ours")
    assert Owner.value == "ours"
    _compat.undo_patches()
    assert Owner.value == "original"
    first.undo()  # twice: nothing happens
    assert Owner.value == "original"
    _compat.patch(Owner, "value", "ours")
    Owner.value = "theirs"  # the script replaced it after us: theirs stays
    _compat.undo_patches()
    assert Owner.value == "theirs"


# --- capture started and stopped in one process: every original is back ----------------------

PROCESS = r"""
import json, logging, sys
from pathlib import Path
import torch, torch._dynamo, torch._functorch.config, torch._inductor.compile_fx, torch._inductor.config
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter
from torchrepro import _compat
from torchrepro.capture.session import CaptureSession
from torchrepro.runtime.prepare import prepare
from torchrepro.runtime.run_options import RunOptions

compile_mode, fix, replay, run_dir = sys.argv[1:]
trace = logging.getLogger("torch.__trace")
fx, dynamo, inductor = torch._inductor.compile_fx, torch._dynamo.config, torch._inductor.config


def state():
    return {"compile_fx": fx.compile_fx, "compile_fx_inner": fx.compile_fx_inner,
            "set_num_threads": torch.set_num_threads, "compile": torch.compile,
            "Module.__call__": torch.nn.Module.__call__, "backward": torch.autograd.backward,
            "Optimizer.__init__": torch.optim.Optimizer.__init__, "DataLoader.__next__": _BaseDataLoaderIter.__next__,
            "fallback_random": inductor.fallback_random, "disable": dynamo.disable,
            "autograd_cache": torch._functorch.config.enable_autograd_cache,
            "trace": (trace.level, trace.propagate, ours(trace.handlers)), "meta_path": ours(sys.meta_path)}


def ours(objects):  # torch removes its own lazy trace handler once it knows TORCH_TRACE is unset
    return [o for o in objects if type(o).__module__.startswith("torchrepro")]


before = state()
threads = torch.get_num_threads()
options = RunOptions(run_dir=Path(run_dir), compile_mode=compile_mode, fix=fix, replay_step=50,
                     replay_graphs=replay == "graphs", replay_kernels=replay == "kernels")
prepare(options)
session = CaptureSession(options.capture_config())
session.start()
during = state()
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model, backend="eager")
for (x,) in DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4):
    compiled(x).sum().backward()
    opt.step()
session.stop(0)
after = state()
torch.set_num_threads(threads)
print(json.dumps({"changed": sorted(k for k in before if during[k] != before[k]),
                  "not_restored": sorted(k for k in before if after[k] != before[k])}))
"""


@pytest.mark.parametrize(
    "compile_mode, fix, replay", [("fallback-random", "aot_eager", "kernels"), ("eager", "threads_1", "graphs")]
)
def test_capture_undoes_every_patch_when_it_stops(tmp_path, compile_mode, fix, replay):
    proc = subprocess.run(
        [sys.executable, "-c", PROCESS, compile_mode, fix, replay, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["not_restored"] == []
    patched = {"set_num_threads", "disable"} if fix == "threads_1" else {"compile_fx", "fallback_random"}
    if replay == "kernels" and torch._functorch.config.enable_autograd_cache:  # off by default on torch 2.6
        patched |= {"autograd_cache"}
    # what capture itself wraps (and more) was changed while it ran: the comparison can fail
    assert patched | {"Module.__call__", "backward", "Optimizer.__init__", "DataLoader.__next__", "trace"} <= set(
        result["changed"]
    )
    capabilities = {c.name: c for c in read_events(tmp_path / "run" / "rank-0" / "events.jsonl").of(Capability)}
    assert {"torch_api.trace_log", "torch_api.skip_code", "torch_api.compile_fx"} <= set(capabilities)
    assert all(
        c.available for name, c in capabilities.items() if name.startswith("torch_api.") and name[10:] not in MISSING
    )
    assert all(
        not capabilities[f"torch_api.{name}"].available for name in MISSING if f"torch_api.{name}" in capabilities
    )


# --- the event log keeps what torch said ------------------------------------------------------

REASON = "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5"


def test_a_recompile_event_keeps_dynamos_reason_and_no_category():
    translator = TraceTranslator()
    translator.feed(
        {
            "dynamo_start": {"stack": [{"name": "forward", "filename": "train.py", "line": 3}]},
            "frame_id": 0,
            "frame_compile_id": 1,
        }
    )
    translator.feed(
        {"artifact": {"name": "recompile_reasons", "encoding": "json"}, "frame_id": 0, "frame_compile_id": 1},
        json.dumps([REASON]),
    )
    (event,) = translator.feed({"compilation_metrics": {"co_name": "forward"}, "frame_id": 0, "frame_compile_id": 1})
    assert isinstance(event, Compile) and event.recompile_reasons == [REASON.removeprefix("0/0: ")]
    assert "category" not in event.to_json()


def test_a_log_written_with_categories_analyses_as_before(tmp_path):
    """Logs written before the event log was raw hold a ``category`` per recompile: ignored (even
    a wrong one), recomputed from the reason."""
    runs = {}
    for name in ("raw", "with_category"):
        run_dir = tmp_path / name
        write_all(run_dir / "rank-0" / "events.jsonl", rank_events(0, 1, steps=6, recompiles=3))
        (run_dir / "run.json").write_text(
            json.dumps({"command": ["torchrepro", "doctor"], "exit_code": 0, "world_size": 1})
        )
        runs[name] = run_dir
    path = runs["with_category"] / "rank-0" / "events.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        if line["kind"] == "compile":
            line["category"] = "dtype" if line["recompile_reasons"] else None  # what no analysis says
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    reports = {}
    for name, run_dir in runs.items():
        run = load_run(run_dir)
        reports[name] = json.loads(
            json.dumps(analyse(run.meta, run.logs, run.problems).to_json()).replace(str(run_dir), "RUN")
        )
    assert reports["raw"] == reports["with_category"]
    assert reports["raw"]["compile"]["recompiles_by_category"] == {"shape": 3}
    assert {e["category"] for e in reports["raw"]["compile"]["recompile_events"]} == {"shape"}


def test_the_torch_version_without_importing_torch_is_the_one_import_would_load(tmp_path):
    """The installed distribution's version where its torch is the one on the path; a torch
    earlier on the path (a source checkout) is asked itself."""
    code = "import sys; from torchrepro._compat import installed_torch_version as v; print(v(), 'torch' in sys.modules)"
    run = lambda **env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout.split()
    assert run() == [torch.__version__, "False"]
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("__version__ = '0.0+checkout'\n")
    assert run(PYTHONPATH=str(tmp_path)) == ["0.0+checkout", "True"]


# --- what each supported torch says, read the same way -----------------------------------------
# Guard texts and records as torch 2.6.0 and 2.13.0/2.14.1 write them (copied from their TORCH_TRACE logs;
# the ids are those of that process's True and of a function). The corpus test (tests/compat/) reads whole
# logs of each version; these pin each difference to the category a user would name.

TRUE_ID, FALSE_ID, SIN_ID = 139814190214912, 139814190214944, 139814176828896
GUARDS_2_6 = """
TREE_GUARD_MANAGER:
+- RootGuardManager
| +- GuardManager: source={source}, accessed_by=DictGetItemGuardAccessor('flag')
| | +- {guard}
"""


def _recompile(reason: str, guards: str | None = None, constants: dict[int, str] | None = None) -> Compile:
    """The recompile event a translator makes of ``reason`` (and the new compile's guards, as 2.6 logs them)."""
    translator = TraceTranslator(constants=constants or {})
    ids = {"frame_id": 0, "frame_compile_id": 1}
    translator.feed({"artifact": {"name": "recompile_reasons", "encoding": "json"}, **ids}, json.dumps([reason]))
    if guards is not None:
        translator.feed({"dynamo_cpp_guards_str": {}, **ids}, guards)
    (event,) = translator.feed({"compilation_metrics": {"co_name": "f", "compile_id": "0/1"}, **ids})
    return event


@pytest.mark.parametrize(
    "reason, category",
    [
        # torch 2.13 / 2.14: a value guard
        (
            "0/0: flag == True                                             # return x + 1 if flag else x - 1",
            "python_value",
        ),
        ("1/0: fn._modules['1'].training == True", "module_attribute"),
        ("2/0: G['FLAG'] == True", "python_global"),
        ("3/0: GLOBAL_STATE changed: autocast(cpu)_enabled ", "autocast"),
        ("4/0: ___check_obj_id(fn, 140308072942944), type=<class 'builtin_function_or_method'>", "object_identity"),
        # torch 2.6: identity guards whose source says what they are, and autocast as a dispatch key
        (f"1/0: ___check_obj_id(L['fn']._modules['1'].training, {TRUE_ID})", "module_attribute"),
        (f"2/0: ___check_obj_id(G['FLAG'], {TRUE_ID})                 ", "python_global"),
        (
            "3/0: tensor 'L['a']' dispatch key set mismatch. expected DispatchKeySet(CPU, BackendSelect, "
            "ADInplaceOrView, AutogradCPU), actual DispatchKeySet(CPU, BackendSelect, ADInplaceOrView, AutogradCPU, "
            "AutocastCPU)",
            "autocast",
        ),
        (
            "tensor 'L['a']' dispatch key set mismatch. expected DispatchKeySet(CPU, BackendSelect), "
            "actual DispatchKeySet(CUDA, BackendSelect)",
            "device",
        ),
        (f"4/0: ___check_obj_id(L['fn'], {SIN_ID})                   ", "object_identity"),
    ],
)
def test_each_versions_guard_text_has_the_category_a_user_would_name(reason, category):
    assert category_of(_recompile(reason)) == category


def test_an_identity_guard_on_a_python_constant_is_a_python_value():
    """torch 2.6 guards a bool argument by identity: live, the id is compared with this process's
    True/False/None/small ints; in a log read afterwards, the guard of the compile that replaced it says
    (the other bool, or the same source now guarded by value); an unknown id stays an object."""
    reason = f"0/0: ___check_obj_id(L['flag'], {id(True)})                 "
    live = _recompile(reason, constants=constant_ids())
    assert live.constant_ids == {str(id(True)): "True"} and category_of(live) == "python_value"
    assert constant_ids()[id(None)] == "None" and constant_ids()[id(7)] == "7"

    reason = f"0/0: ___check_obj_id(L['flag'], {TRUE_ID})                 "
    now_false = GUARDS_2_6.format(source="L['flag']", guard=f"ID_MATCH: ___check_obj_id(L['flag'], {FALSE_ID})")
    read = _recompile(reason, now_false)
    assert read.constant_ids == {str(TRUE_ID): "True"} and category_of(read) == "python_value"
    now_value = GUARDS_2_6.format(source="L['flag']", guard="EQUALS_MATCH: L['flag'] == 2.0      ")
    assert category_of(_recompile(reason, now_value)) == "python_value"
    another = GUARDS_2_6.format(source="L['fn']", guard=f"ID_MATCH: ___check_obj_id(L['flag'], {SIN_ID})")
    assert category_of(_recompile(reason, another)) == "object_identity"
    assert category_of(_recompile(reason)) == "object_identity"  # nothing says what the id was


def test_none_replaced_by_a_bool_in_a_log_of_this_python_build_is_a_python_value():
    """torch 2.6 guards None by identity too: read afterwards, a None replaced by a bool is told by the
    distance of the two ids, None's and the bool's in this CPython build (the log's ids shifted as
    another process of the same build would have them); an id at another distance is still an object."""
    shift = TRUE_ID - id(True)  # where this build's None is in the process that wrote the log
    reason = f"0/0: ___check_obj_id(L['flag'], {id(None) + shift})                 "
    now_true = GUARDS_2_6.format(source="L['flag']", guard=f"ID_MATCH: ___check_obj_id(L['flag'], {TRUE_ID})")
    read = _recompile(reason, now_true)
    assert read.constant_ids == {str(id(None) + shift): "None"} and category_of(read) == "python_value"
    back = f"0/1: ___check_obj_id(L['flag'], {FALSE_ID})                 "
    now_none = GUARDS_2_6.format(source="L['flag']", guard=f"ID_MATCH: ___check_obj_id(L['flag'], {id(None) + shift})")
    assert category_of(_recompile(back, now_none)) == "python_value"
    far = GUARDS_2_6.format(source="L['flag']", guard=f"ID_MATCH: ___check_obj_id(L['flag'], {SIN_ID})")
    assert category_of(_recompile(reason, far)) == "object_identity"


@pytest.mark.parametrize(
    "record, limit, switch",
    [
        # torch 2.6: a bwd record, the limit named cache_size_limit
        (
            {
                "bwd_compilation_metrics": {
                    "compile_id": "0/2",
                    "co_name": None,
                    "fail_type": "RecompileLimitExceeded",
                    "fail_reason": "cache_size_limit reached",
                }
            },
            "cache_size_limit",
            "fail_on_cache_limit_hit",
        ),
        # torch 2.7 to 2.12
        (
            {
                "compilation_metrics": {
                    "compile_id": "0/2",
                    "fail_type": "RecompileLimitExceeded",
                    "fail_reason": "recompile_limit reached",
                }
            },
            "recompile_limit",
            "fail_on_recompile_limit_hit",
        ),
        # torch 2.13 / 2.14
        (
            {
                "compilation_metrics": {
                    "compile_id": "0/2",
                    "fail_type": "RecompileLimitExceeded",
                    "fail_reason": "Dynamo recompile limit exceeded\n  Limit type: recompile_limit",
                }
            },
            "recompile_limit",
            "fail_on_recompile_limit_hit",
        ),
    ],
)
def test_the_recompile_limit_is_an_error_under_both_names(tmp_path, record, limit, switch):
    translator = TraceTranslator()
    events = []
    for attempt in (0, 1):
        ids = {"frame_id": 0, "frame_compile_id": attempt}
        if attempt:
            translator.feed({"artifact": {"name": "recompile_reasons"}, **ids}, json.dumps(["0/0: size mismatch"]))
        events += translator.feed({"compilation_metrics": {"co_name": "f", "co_filename": "t.py"}, **ids})
    translator.feed({"artifact": {"name": "recompile_reasons"}, "frame_id": 0, "frame_compile_id": 2}, '["0/1: x"]')
    events += translator.feed({**record, "frame_id": 0, "frame_compile_id": 2})
    write_all(tmp_path / "rank-0" / "events.jsonl", events)
    (tmp_path / "run.json").write_text(json.dumps({"command": ["torchrepro"], "exit_code": 0, "world_size": 1}))
    run = load_run(tmp_path)
    report = analyse(run.meta, run.logs, run.problems).to_json()
    assert [h["limit"] for h in report["compile"]["recompile_limit_hits"]] == [limit]
    assert report["compile"]["compiles"] == 2 and report["compile"]["recompiles"] == 1
    (finding,) = [f for f in report["findings"] if f["code"] == "RECOMPILE_LIMIT_HIT"]
    assert finding["severity"] == "error" and f"config.{limit}" in finding["title"] and switch in finding["hint"]


def test_a_torch_outside_the_tested_range_is_said_by_env():
    assert _compat.outside_tested_range(torch.__version__) is None  # the torch these tests run on
    assert _compat.outside_tested_range("2.14.2+cu130") is None  # a patch release of a tested one
    assert "older than" in _compat.outside_tested_range("2.5.1")
    assert "newer than" in _compat.outside_tested_range("2.15.0a0+git1234")
    code = (
        "import sys, torchrepro._compat as c; c.TESTED_TORCH = ('1.0.0', '1.1.0'); "
        "from torchrepro.cli import main; sys.exit(main(['env', '--json']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outside = json.loads(proc.stdout)["torch_tested"]
    assert outside["range"] == ["1.0.0", "1.1.0"] and f"torch {torch.__version__} is newer" in outside["outside"]
    assert proc.stderr.strip() == f"torchrepro: warning: {outside['outside']}"
