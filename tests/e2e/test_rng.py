"""RngState: capture/restore (eager and compiled), safe save/load, clear errors."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from torchrepro import _state
from torchrepro import rng as rngmod
from torchrepro.errors import RngStateError
from torchrepro.rng import RngState, register


@pytest.fixture(autouse=True)
def _clean_registry():
    yield
    _state.clear_generators()


def _dropout_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4))


def _draw_all(model, x):
    return (random.random(), float(np.random.rand()), model(x).detach().clone())


@pytest.mark.parametrize("backend", [None, "aot_eager"])
def test_restore_repeats_dropout(backend):
    model = _dropout_model()
    fn = model if backend is None else torch.compile(model, backend=backend)
    x = torch.ones(8, 16)
    fn(x)  # compile first: compiling must not matter
    state = RngState.capture()
    first = _draw_all(fn, x)
    state.restore()
    second = _draw_all(fn, x)
    assert first[:2] == second[:2] and torch.equal(first[2], second[2])
    torch._dynamo.reset()


@pytest.mark.inductor
def test_restore_repeats_inductor_dropout():
    model = _dropout_model()
    fn = torch.compile(model, backend="inductor")
    x = torch.ones(8, 16)
    fn(x)
    state = RngState.capture()
    a = fn(x).detach().clone()
    b = fn(x).detach().clone()
    state.restore()
    assert torch.equal(a, fn(x)) and torch.equal(b, fn(x))
    assert not torch.equal(a, b)
    torch._dynamo.reset()


def test_registered_generators_are_captured_and_restored():
    tg = register("sampler", torch.Generator().manual_seed(3))
    ng = register("aug", np.random.default_rng(4))
    state = RngState.capture()
    first = (torch.randperm(10, generator=tg), ng.random(3))
    state.restore()
    second = (torch.randperm(10, generator=tg), ng.random(3))
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1])


def test_restore_refuses_unregistered_generator():
    register("sampler", torch.Generator())
    state = RngState.capture()
    _state.clear_generators()
    with pytest.raises(RngStateError, match="sampler"):
        state.restore()


def test_fingerprint_tracks_state():
    state = RngState.capture()
    torch.rand(1)
    after = RngState.capture()
    assert state.fingerprint() != after.fingerprint()
    changed = {k for k, v in after.fingerprints().items() if state.fingerprints()[k] != v}
    assert changed == {"torch_cpu"}
    state.restore()
    assert RngState.capture().fingerprint() == state.fingerprint()


def test_save_load_round_trip_in_fresh_process(tmp_path, run_python):
    save = (
        "import json, random, numpy as np, torch\n"
        "from torchrepro import seed_everything, RngState\n"
        "plan = seed_everything(5)\n"
        "g = plan.make_generator('sampler')\n"
        "torch.rand(3); random.random()\n"
        f"RngState.capture().save({str(tmp_path)!r})\n"
        "print(json.dumps([random.random(), float(np.random.rand()), torch.rand(2).tolist(),"
        " torch.randperm(5, generator=g).tolist()]))\n"
    )
    load = (
        "import json, random, numpy as np, torch\n"
        "from torchrepro import RngState\n"
        "from torchrepro.rng import register\n"
        "g = register('sampler', torch.Generator())\n"
        f"RngState.load({str(tmp_path)!r}).restore()\n"
        "print(json.dumps([random.random(), float(np.random.rand()), torch.rand(2).tolist(),"
        " torch.randperm(5, generator=g).tolist()]))\n"
    )
    expected = json.loads(run_python(save).stdout)
    assert (tmp_path / "rng-rank0.json").exists()
    assert json.loads(run_python(load, env={"PYTHONHASHSEED": "77"}).stdout) == expected


def test_file_is_plain_json_not_pickle(tmp_path):
    path = RngState.capture().save(tmp_path / "state.json")
    doc = json.loads(path.read_text())
    assert doc["schema"] == "torchrepro.rng/1" and doc["state"]["torch_version"] == torch.__version__


@pytest.mark.parametrize("damage", ["truncate", "flip", "not_json", "other_schema"])
def test_corrupt_file_is_a_clear_error(tmp_path, damage):
    path = RngState.capture().save(tmp_path)
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "flip":
        doc = json.loads(text)
        doc["state"]["numpy"]["pos"] += 1
        path.write_text(json.dumps(doc))
    elif damage == "not_json":
        path.write_bytes(b"\x80\x04\x95garbage")
    else:
        path.write_text(json.dumps({"schema": "something/9"}))
    with pytest.raises(RngStateError) as info:
        RngState.load(tmp_path)
    assert str(path) in str(info.value)


def _rewrite(path, **changes):
    doc = json.loads(path.read_text())
    doc["state"].update(changes)
    doc["sha256"] = __import__("hashlib").sha256(rngmod._canonical(doc["state"])).hexdigest()
    path.write_text(json.dumps(doc))


def test_world_size_and_version_mismatch_raise(tmp_path):
    path = RngState.capture().save(tmp_path)
    with pytest.raises(RngStateError, match="world size 1"):
        RngState.load(tmp_path, world_size=4)
    with pytest.raises(RngStateError, match="no RNG state file"):
        RngState.load(tmp_path, rank=1)
    _rewrite(path, torch_version="1.13.0")
    with pytest.raises(RngStateError, match="torch 1.13.0"):
        RngState.load(tmp_path)
    assert RngState.load(tmp_path, allow_version_mismatch=True).torch_version == "1.13.0"


def test_fork_streams_are_part_of_the_state(tmp_path, run_python):
    from torchrepro import seed_everything

    plan = seed_everything(9)
    with plan.fork("dropout"):
        torch.rand(2)
    state = RngState.capture()
    assert any(k.startswith("fork:dropout") for k in state.fingerprints())
    with plan.fork("dropout"):
        first = torch.rand(3)
    state.restore()
    with plan.fork("dropout"):
        assert torch.equal(first, torch.rand(3))
    state.save(tmp_path)
    code = (
        "import torch, json\n"
        "from torchrepro import seed_everything, RngState\n"
        "plan = seed_everything(9)\n"
        f"RngState.load({str(tmp_path)!r}).restore()\n"
        "with plan.fork('dropout'):\n"
        "    print(json.dumps(torch.rand(3).tolist()))\n"
    )
    assert json.loads(run_python(code).stdout) == first.tolist()
