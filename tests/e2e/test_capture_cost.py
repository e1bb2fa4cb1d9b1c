"""Invariants behind capture's low cost (docs/evidence/performance.md): the in-place RNG reads give the
official state's bytes, no host reads of step tensors outside the batch point, the event log
survives SIGKILL, and a script that never compiles does not import Dynamo."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from torchrepro import rng_raw


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_in_place_rng_reads_equal_the_official_state(seed):
    assert rng_raw._PY_LAYOUT is not None and rng_raw._NP_AUG >= 0, "calibration fell back to the slow path"
    py, npr = random.getstate(), np.random.get_state()
    try:
        random.seed(seed)
        np.random.seed(seed)
        for draw in (
            lambda: None,
            random.random,
            lambda: random.gauss(0, 1),
            lambda: np.random.rand(7),
            np.random.standard_normal,
            np.random.standard_normal,
            lambda: np.random.seed(seed + 1),
            lambda: None,
            lambda: random.seed(seed),
            lambda: random.setstate(py),  # states read before
            lambda: np.random.set_state(npr),
        ):
            draw()
            assert rng_raw.python_state_bytes() == rng_raw.python_bytes(random.getstate())
            _, words, pos, has_gauss, cached = np.random.get_state(legacy=True)
            assert rng_raw.numpy_state_bytes() == rng_raw.numpy_bytes(
                words.astype("<u4").tobytes(), pos, has_gauss, cached
            )
    finally:
        random.setstate(py)
        np.random.set_state(npr)


def test_the_torch_generator_watch_refuses_what_it_cannot_prove():
    """The in-place watch of torch's CPU generator reads memory through a layout it checked: an
    unmapped address reads as nothing (no crash), and every other offset fails the check."""
    import torch

    assert rng_raw._peek(0, 8) is None and rng_raw._peek(8, 4096) is None
    gen = torch.Generator().manual_seed(11)
    start, size = rng_raw._TORCH_SPAN
    assert rng_raw._torch_layout(gen, start) == (start, size)
    assert all(rng_raw._torch_layout(gen, at) is None for at in range(0, 256, 4) if at != start)
    torch.randn(1, generator=gen)  # a cached normal sample: still the same layout
    assert rng_raw._torch_layout(gen, start) == (start, size)


def test_the_step_rng_digests_are_those_of_the_official_states():
    """live_fingerprints (each step) digests what torch.get_rng_state(), random.getstate() and
    numpy's get_state() give, draw after draw: also while it only watches the generators'
    memory and reuses the last digests (every kind of draw and restore must be seen)."""
    import torch

    from torchrepro.digests import hash_bytes
    from torchrepro.rng import live_fingerprints

    assert rng_raw._TORCH_SPAN is not None and rng_raw.host_raw() is not None, "no in-place watch here"
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()
    generator = torch.Generator().manual_seed(3)
    try:
        for draw in (
            lambda: None,
            lambda: torch.rand(3),
            lambda: torch.rand(1),  # one word: only the position moves
            lambda: torch.randn(1),  # a normal sample cached
            lambda: torch.randn(1),  # and used
            lambda: torch.rand(1000),  # past a twist
            lambda: torch.manual_seed(7),
            lambda: torch.randn(2, 2),
            lambda: torch.set_rng_state(states[0]),  # a state seen before
            lambda: torch.rand(3, generator=generator),  # another generator: nothing changes
            lambda: torch.nn.functional.dropout(torch.ones(64), 0.5),
            random.random,
            lambda: random.gauss(0, 1),
            lambda: np.random.rand(2),
            lambda: np.random.seed(5),
            lambda: None,
        ):
            draw()
            for _ in range(2):  # the first read after a change, then the reused digests
                fps = live_fingerprints()
                assert fps["torch_cpu"] == hash_bytes(torch.get_rng_state().numpy().tobytes())[:16]
                assert fps["python"] == hash_bytes(rng_raw.python_bytes(random.getstate()))[:16]
                _, words, pos, has_gauss, cached = np.random.get_state(legacy=True)
                numpy_state = rng_raw.numpy_bytes(words.astype("<u4").tobytes(), pos, has_gauss, cached)
                assert fps["numpy"] == hash_bytes(numpy_state)[:16]
        assert live_fingerprints() is live_fingerprints()  # nothing drawn: the last digests, not re-read
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


STREAMS = r"""
import json, torch, numpy as np
from torchrepro import RngState, seed_everything
from torchrepro.rng import live_fingerprints, register
host = live_fingerprints()
plan = seed_everything(3)
sampler = register("sampler", torch.Generator().manual_seed(1))
register("aug", np.random.default_rng(2))
with plan.fork("dropout"):
    torch.rand(2)
seen = []
for draw in (lambda: None, lambda: torch.rand(2, generator=sampler), lambda: np.random.default_rng(0)):
    draw()
    live, official = live_fingerprints(), RngState.capture().fingerprints()
    seen.append({k: [live.get(k), official[k]] for k in official if k.startswith(("generator:", "fork:"))})
print(json.dumps({"seen": seen, "host_keys": sorted(host)}))
"""


def test_the_step_rng_digests_name_every_registered_generator_and_fork(run_python):
    """Most runs have no other generator and the step's digests are the host's, returned as they
    are; a registered generator or a seed plan's fork() stream is in them, digested as
    RngState's own fingerprints are, and its digest follows its draws."""
    out = json.loads(run_python(STREAMS).stdout)
    assert out["host_keys"] == ["numpy", "python", "torch_cpu"]
    first, drawn, _ = out["seen"]
    assert set(first) == {"generator:sampler", "generator:aug", "fork:dropout[rank=0]"}
    assert all(live == official for seen in out["seen"] for live, official in seen.values())
    assert (
        drawn["generator:sampler"] != first["generator:sampler"]
        and drawn["fork:dropout[rank=0]"] == first["fork:dropout[rank=0]"]
    )


HOST_READS = r"""
import json, sys, traceback
from pathlib import Path
import torch
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, TensorDataset
from torchrepro.capture.session import CaptureConfig, CaptureSession
from torchrepro.capture.steps import StepConfig

READS = {"item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy", "__array__"}
reads = []

class CountHostReads(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_cpu = name == "to" and any(str(a) == "cpu" for a in [*args[1:], *kwargs.values()])
        if name in READS or to_cpu:
            chain = [f.name for f in traceback.extract_stack() if "/torchrepro/" in f.filename]
            reads.append([name, chain])
        return func(*args, **kwargs)

torch.manual_seed(0)
optimizer_mode = sys.argv[1] == "optimizer"
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
session = CaptureSession(CaptureConfig(run_dir=Path("run"), steps=StepConfig(fingerprint_every=1, grads=True)))
session.start()
opt = torch.optim.SGD(model.parameters(), lr=0.1) if optimizer_mode else None
with CountHostReads():
    for x, y in data:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        torch.autograd.backward(loss)  # (loss.backward() would run the wrapper with the counter off)
        if opt:
            opt.step()
            opt.zero_grad()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None
    float(loss)  # the script's own read: proves the counter sees float()
    session.stop(0)
print(json.dumps({"reads": reads, "batch_reads": session.steps._readback.reads,
                  "params": len(list(model.parameters()))}))
"""


@pytest.mark.parametrize("clock", ["optimizer", "backward"])
def test_capture_reads_step_tensors_only_at_the_batch_point(run_python, tmp_path, clock):
    """Under capture every host read of a tensor (item/float/tolist/cpu/numpy...) comes from an
    allowed place: the batch point (Readback.add or .poll), a CPU loss in the backward() wrapper
    (no device to wait for), hashing host memory on the CPU path of
    fingerprint_later (a DeviceDigest on other devices), the RNG states (host tensors), the
    DataLoader's host batches, and the initial parameters once."""
    import json

    (tmp_path / "count.py").write_text(HOST_READS)
    out = run_python(f"import sys, runpy; sys.argv = ['count.py', {clock!r}]; runpy.run_path('count.py')")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    steps = len(_step_lines(tmp_path))
    assert steps == 8
    entry = {
        "poll": 0,
        "backward": 0,
        "fingerprint_later": 0,
        "live_fingerprints": 0,
        "_note_batch": 0,
        "init": 0,
        "nonfinite_params": 0,
    }
    user = []  # reads by the script (and torch under it), not by capture
    for name, chain in result["reads"]:
        if not chain:
            user.append(name)
            continue
        found = next(
            (e for e in ("fingerprint_later", "live_fingerprints", "_note_batch", "nonfinite_params") if e in chain),
            None,
        )
        if "_cpu_values" in chain:  # the batch point: Readback.add (nothing waiting) or Readback.poll
            assert chain[chain.index("_cpu_values") - 1] in ("add", "poll"), chain
            found = "poll"
        if chain[-2:] == ["_note_backward", "note"]:  # a CPU loss, read where backward() is called on it (StepLosses)
            found = "backward"
        if found is None:
            assert chain[-2:] == ["_note_module_call", "fingerprint"] or "_note_module_call" in chain, chain
            found = "init"
        assert name in ("item", "tolist") if found in ("poll", "backward", "nonfinite_params") else name == "numpy", (
            name,
            chain,
        )
        entry[found] += 1
    assert "__float__" in user  # the script's float(loss): the counter sees float()
    assert result["batch_reads"] == steps  # on the CPU: one batch point per step, at its end
    # at the batch point the gradient norm and the per-parameter norms (two CPU tensors: nothing to wait for, read
    # one by one); the loss in backward()
    assert entry["poll"] == 2 * steps and entry["backward"] == steps, entry
    assert entry["init"] <= result["params"]  # the InitParams event, once
    assert entry["nonfinite_params"] == 1  # the initial parameters' NaN/inf check: one read for the device, once
    # CPU tensors (batches, parameters, RNG states) are hashed by address: no read through torch
    assert entry["fingerprint_later"] == entry["_note_batch"] == 0, entry
    assert entry["live_fingerprints"] <= 1, entry  # once: the torch generator's layout checked


def test_a_device_digest_read_back_later_equals_the_fingerprint_of_the_same_sums():
    """fingerprint_later's DeviceDigest (sums read at the batch point) gives what the immediate
    device path gives; computed here on the CPU, where both paths run too."""
    import torch
    import xxhash

    from torchrepro import digests
    from torchrepro.capture.readback import as_float, as_int64

    for t in (torch.randn(3, 5), torch.arange(7, dtype=torch.int16), torch.randn(4, 4).t()):
        dense = digests._dense(t)
        later = digests.DeviceDigest(digests._device_sums(dense), digests._header("device-sum64x2", t.dtype, t.shape))
        s1, s2 = later.sums.tolist()
        assert later.finish(s1, s2) == xxhash.xxh3_128_hexdigest(b"t" + digests._device_digest(t))
    assert digests.fingerprint_later(torch.ones(3)) == digests.fingerprint(torch.ones(3))  # CPU: at once
    for value in (2.308467388153076, float("nan"), -0.0, 1e-300):
        word = as_int64(torch.tensor(value, dtype=torch.float64)).tolist()[0]
        assert struct_bits(as_float(word)) == struct_bits(value)


def struct_bits(x: float) -> bytes:
    import struct

    return struct.pack("<d", x)


NO_COMPILE = r"""
import sys
from pathlib import Path
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchrepro.capture.session import CaptureConfig, CaptureSession

session = CaptureSession(CaptureConfig(run_dir=Path("run")))
session.start()
assert "torch._dynamo" not in sys.modules, "capture imported Dynamo at start"
model = torch.nn.Linear(4, 1)
for x, y in DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    with torch.no_grad():
        model.weight -= 0.1 * model.weight.grad
        model.weight.grad = None
session.stop(0)
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""

LAUNCHERS = r"""
import json, sys
from pathlib import Path
from torchrepro.cli import main

# updated by hand: torch.optim would import Dynamo in each of the three runs (~1.3 s of CPU each), which is
# not what this test measures
Path("one_step.py").write_text(
    "import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(2, 1)\nm(torch.ones(3, 2)).sum().backward()\n"
    "with torch.no_grad():\n    m.weight -= 0.1 * m.weight.grad\n"
)
codes = [main(["doctor", "--out", "doc", "one_step.py"]), main(["check", "--out", "chk", "--no-localize", "one_step.py"])]
header = json.loads(Path("doc/rank-0/events.jsonl").read_text().splitlines()[0])
print(json.dumps({"codes": codes, "torch imported": "torch" in sys.modules,
                  "meta": json.loads(Path("doc/run.json").read_text())["torch_version"],
                  "child": header["env"]["versions"]["torch"]}))
"""


def test_the_launching_process_does_not_import_torch(run_python):
    """doctor and check only start the script's processes: importing torch there (~2 s of CPU) is
    paid for nothing; the version run.json records is still the one the script ran with."""
    out = json.loads(run_python(LAUNCHERS).stdout.splitlines()[-1])
    assert out["codes"] == [0, 0] and out["torch imported"] is False, out
    assert out["meta"] == out["child"] and out["meta"].startswith("2."), out


def test_a_rank_process_starts_without_the_terminal_views(run_python):
    """Every rank runs `python -m torchrepro run`: only that command's parser is built (no other
    command module imported, ~60 ms of CPU per process), the report model (~20 ms) only where a
    report is finished, and rich (the terminal views, ~40 ms) only where a view is drawn; the full
    parser imports neither rich nor torch either. What every command shares is there: the option
    layer, the sanitiser of its error line and the way a path is shown (all the standard library only)."""
    out = run_python(
        "import sys, torchrepro.cli\n"
        "torchrepro.cli.build_parser('run')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'torch') or m.startswith("
        "('torchrepro.commands.', 'torchrepro.render'))))\n"
        "torchrepro.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'torch')))"
    )
    shared = "'torchrepro.commands._finish', 'torchrepro.commands.options', 'torchrepro.commands.run'"
    render = "'torchrepro.render', 'torchrepro.render.paths', 'torchrepro.render.sanitize'"
    assert out.stdout.split("\n")[:2] == [f"[{shared}, {render}]", "[]"]


COMPILE_LATER = r"""
import sys
from pathlib import Path
import torch
from torchrepro.capture.session import CaptureConfig, CaptureSession

session = CaptureSession(CaptureConfig(run_dir=Path("run")))
session.start()
assert "torch._dynamo" not in sys.modules
import torch._dynamo  # the script compiles after capture started: the wrappers are hidden from Dynamo now
next_ = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
assert getattr(next_, "_torchdynamo_disable", False), "DataLoader wrapper not hidden from Dynamo"
import torch.distributed.fsdp  # noqa: F401 - the fully_shard observer is installed now
model = torch.compile(torch.nn.Linear(4, 1), backend="eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 4)).sum().backward()
opt.step()
session.stop(0)
assert not getattr(torch.utils.data.dataloader._BaseDataLoaderIter.__next__, "_torchdynamo_disable", False)
print("ok")
"""


def test_a_script_that_never_compiles_never_imports_dynamo(run_python, tmp_path):
    out = run_python(NO_COMPILE)
    assert "dynamo imported: False" in out.stdout
    steps = _step_lines(tmp_path)
    assert len(steps) == 4 and all('"batch_fp"' in s and '"loss"' in s and '"rng_fp"' in s for s in steps)


def test_dynamo_imported_after_start_still_gets_the_wrappers_hidden(run_python, tmp_path):
    """Importing Dynamo imports torch.distributed.fsdp, whose observer wraps fully_shard and asks
    to hide it from Dynamo while Dynamo is still being imported: that waits until it is done."""
    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.events import Capability, Step

    assert "ok" in run_python(COMPILE_LATER).stdout
    log = read_events(tmp_path / "run/rank-0/events.jsonl")
    caps = {c.name: c for c in log.of(Capability)}
    assert "capture_error" not in caps and caps["fsdp2_init"].available
    assert len(log.of(Step)) == 1


KILLED = r"""
import os, signal, sys
from pathlib import Path
import torch
from torchrepro.capture.session import CaptureConfig, CaptureSession

session = CaptureSession(CaptureConfig(run_dir=Path("run")))
session.start()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()  # the step ends here: its event must be in the log from now on
    opt.zero_grad()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    "steps", [pytest.param(1, marks=pytest.mark.slow), 7, pytest.param(40, marks=pytest.mark.slow)]
)
def test_the_log_holds_every_completed_step_after_sigkill(run_python, tmp_path, steps):
    import signal

    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.events import Step

    (tmp_path / "killed.py").write_text(KILLED)
    proc = run_python(
        f"import sys, runpy; sys.argv = ['killed.py', '{steps}']; runpy.run_path('killed.py')", check=False
    )
    assert proc.returncode == -signal.SIGKILL
    log = read_events(tmp_path / "run/rank-0/events.jsonl")
    got = log.of(Step)
    assert [s.index for s in got] == list(range(steps)) and not log.problems and log.end is None
    assert all(s.loss is not None and s.rng_fp and s.batch_fp for s in got)
    assert all(s.params_fp for s in got[:5])  # the automatic interval fingerprints its first steps


def _step_lines(run_root) -> list[str]:
    """The step events of the run's rank 0, each as a JSON line."""
    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.events import Step

    return [json.dumps(s.to_json()) for s in read_events(run_root / "run/rank-0/events.jsonl").of(Step)]


def test_fast_json_lines_read_back_exactly_with_nan_and_unknown_fields(tmp_path):
    """Step lines go through orjson unless a number is not finite (orjson would write null):
    every value reads back as written, NaN and inf included; unknown fields are still ignored."""
    import math

    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.event_writer import EventWriter
    from torchrepro.eventlog.events import Step

    steps = [
        Step(index=0, step=0, loss=2.308467388153076, time_s=1e-05, rng_fps={"python": "ab"}, param_fps=["é"]),
        Step(index=1, step=1, loss=float("nan"), grad_norm=float("inf")),
        Step(index=2, step=2, loss=-0.0),
    ]
    path = tmp_path / "rank-0" / "events.jsonl"
    from torchrepro.eventlog.events import Header

    with EventWriter(path) as writer:
        writer.write(Header())
        for step in steps:
            writer.write(step)
    with open(path, "a") as fp:
        fp.write('{"kind":"step","index":3,"step":3,"loss":1.5,"from_the_future":1}\n')
    got = read_events(path).of(Step)
    assert [s.index for s in got] == [0, 1, 2, 3]
    assert got[0].to_json() == steps[0].to_json()
    assert math.isnan(got[1].loss) and got[1].grad_norm == math.inf
    assert math.copysign(1, got[2].loss) == -1 and got[3].loss == 1.5


PARAM_NAMES = r"""
import gc, json, sys
from pathlib import Path
import torch
from torchrepro.capture.session import CaptureConfig, CaptureSession

scans = []
scan = gc.get_objects
gc.get_objects = lambda *args: scans.append(1) or scan(*args)


class Wrapper(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(2, 2))

    def forward(self, x):
        return self.inner(x)


session = CaptureSession(CaptureConfig(run_dir=Path("run")))
session.start()
model, loose = Wrapper(), torch.nn.Parameter(torch.zeros(1))  # loose: in no module at all
params = list(model.parameters()) + ([loose] if sys.argv[1] == "uncalled" else [])
opt = torch.optim.SGD(params, lr=0.1)
for _ in range(2):
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
session.stop(0)
names = [json.loads(line)["names"] for line in open("run/rank-0/events.jsonl") if '"kind":"params"' in line]
print(json.dumps({"names": names, "scans": len(scans)}))
"""


@pytest.mark.parametrize("optimized", ["called", "uncalled"])
def test_parameter_names_come_from_the_modules_called_without_a_scan(run_python, tmp_path, optimized):
    """The optimizer's parameters are named from the module the script called (its submodule with
    the shortest names); only a parameter outside every called module costs a scan of all objects
    (and one in no module at all is named by its place)."""
    import json

    (tmp_path / "names.py").write_text(PARAM_NAMES)
    out = run_python(f"import sys, runpy; sys.argv = ['names.py', {optimized!r}]; runpy.run_path('names.py')")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if optimized == "called":
        assert result == {"names": [["weight", "bias"]], "scans": 0}  # inner.0 names them shortest
    else:
        assert result == {"names": [["weight", "bias", "param2"]], "scans": 1}


RANKS_ONLY = """
import json, sys
from pathlib import Path
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchrepro.capture.session import CaptureConfig, CaptureSession
from torchrepro.capture.steps import StepConfig
from torchrepro.digests import fingerprint

finals = {}
runs = (("doctor-1", 1, True, None), ("doctor-2", 2, True, None), ("run-1", 1, False, None), ("doctor-every-2", 1, True, 2))
for name, world, ranks_only, every in runs:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=8, shuffle=True)
    config = CaptureConfig(run_dir=Path(name), steps=StepConfig(fingerprint_every=every, ranks_only=ranks_only))
    session = CaptureSession(config, rank=(0, world, 0))
    session.start()
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    session.stop(0)
    finals[name] = fingerprint(model)
print(json.dumps(finals))
"""


def test_doctor_alone_takes_no_rng_batch_or_parameter_digests_and_ranks_still_do(run_python, tmp_path):
    """``ranks_only`` (what doctor records): a process alone takes none of the per-step digests
    that only check, diff and the cross-rank checks compare (but the parameter fingerprints an
    explicit interval asks for); one of several ranks takes them all, as ``torchrepro run``
    does; training is the same bit for bit in all."""
    import json

    from torchrepro.eventlog.event_reader import read_events
    from torchrepro.eventlog.events import Step

    (tmp_path / "ranks_only.py").write_text(RANKS_ONLY)
    finals = json.loads(run_python("import runpy; runpy.run_path('ranks_only.py')").stdout.strip().splitlines()[-1])
    assert len(set(finals.values())) == 1, finals  # capture did not change what was trained
    steps = {name: read_events(tmp_path / name / "rank-0" / "events.jsonl").of(Step) for name in finals}
    assert all(len(s) == 8 for s in steps.values())
    alone = steps["doctor-1"]
    assert all(s.rng_fps is None and s.batch_fp is None and s.params_fp is None for s in alone)
    assert all(s.loss is not None and s.time_s is not None for s in alone)
    for name in ("doctor-2", "run-1"):
        assert all(s.rng_fps and s.batch_fp and s.batches == 1 for s in steps[name]), name
        assert all(s.params_fp for s in steps[name][:5]), name  # the automatic interval measures on steps 0-4
    assert [s.rng_fps for s in steps["doctor-2"]] == [s.rng_fps for s in steps["run-1"]]
    assert [s.loss for s in alone] == [s.loss for s in steps["run-1"]]
    every = steps["doctor-every-2"]
    assert [s.index for s in every if s.params_fp] == [0, 2, 4, 6]
    assert all(s.rng_fps is None and s.batch_fp is None for s in every)
