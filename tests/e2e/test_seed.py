"""The seed tree: derivation, named streams, forks, and DataLoader worker seeding."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from torchrepro import _state
from torchrepro import seed as seedmod
from torchrepro.seed import derive, seed_everything, worker_rng


@pytest.fixture(autouse=True)
def _restore_loader_patch():
    yield
    seedmod._unpatch_dataloader()
    _state.reset()


class Draws(Dataset):
    """Every item draws from Python, numpy's global RNG, torch and the worker's numpy stream."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return {
            "worker": info.id if info else -1,
            "tag": getattr(self, "tag", None) if info else None,
            "py": random.random(),
            "np": float(np.random.rand()),
            "torch": float(torch.rand(())),
            "gen": float(worker_rng().random()),
        }


def _collect(loader, epochs=2):
    rows = []
    for epoch in range(epochs):
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        for item in loader:
            rows.append((epoch, int(item["worker"]), item["py"], item["np"], item["torch"], item["gen"]))
    return rows


def _loader(dataset, **kw):
    return DataLoader(dataset, batch_size=None, num_workers=2, **kw)


def _run_rank(rank: int, epochs: int = 2, **kw):
    seed_everything(7, rank=rank)
    return _collect(_loader(Draws(), **kw), epochs)


def test_plain_manual_seed_duplicates_worker_streams_across_ranks():
    """The problem: two ranks seeded alike get the same worker streams (FINDINGS.md)."""
    runs = []
    for _rank in range(2):
        torch.manual_seed(7)
        runs.append(_collect(_loader(Draws()), epochs=1))
    assert [r[4] for r in runs[0]] == [r[4] for r in runs[1]]


def test_worker_streams_distinct_across_rank_worker_epoch_and_reproducible():
    runs = {rank: _run_rank(rank) for rank in (0, 1)}
    values = {}
    for rank, rows in runs.items():
        for epoch, worker, *draws in rows:
            for lib, value in zip(("py", "np", "torch", "gen"), draws):
                values.setdefault(lib, {}).setdefault((rank, worker, epoch), []).append(value)
    for lib, by_stream in values.items():
        assert len(by_stream) == 2 * 2 * 2, lib  # 2 ranks x 2 workers x 2 epochs
        firsts = [tuple(v) for v in by_stream.values()]
        assert len(set(firsts)) == len(firsts), f"{lib}: two (rank, worker, epoch) streams coincide"
    # Python, numpy and torch streams are not copies of one another.
    row = runs[0][0]
    assert len({row[2], row[3], row[4], row[5]}) == 4
    assert _run_rank(0) == runs[0] and _run_rank(1) == runs[1]


def test_user_worker_init_fn_is_kept_and_rank_mixing_survives():
    def user_init(worker_id):
        torch.utils.data.get_worker_info().dataset.tag = 100 + worker_id

    seed_everything(7, rank=0)
    rows0 = _collect(_loader(Draws(), worker_init_fn=user_init), epochs=1)
    seed_everything(7, rank=1)
    loader = _loader(Draws(), worker_init_fn=user_init)
    tags = sorted({int(item["tag"]) for item in loader})
    rows1 = _collect(loader, epochs=1)
    assert tags == [100, 101]
    assert [r[4] for r in rows0] != [r[4] for r in rows1]
    assert loader.worker_init_fn.user_fn is user_init


def test_epoch_comes_from_distributed_sampler():
    dataset = Draws()

    def run(epochs):
        seed_everything(7, rank=1)
        sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
        return _collect(_loader(dataset, sampler=sampler), epochs)

    two = run(2)
    # Resuming at epoch 1 in a fresh loader gives exactly epoch 1's draws.
    seed_everything(7, rank=1)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=False)
    loader = _loader(dataset, sampler=sampler)
    sampler.set_epoch(1)
    resumed = [(1, int(i["worker"]), i["py"], i["np"], i["torch"], i["gen"]) for i in loader]
    assert resumed == [r for r in two if r[0] == 1]
    assert [r[4] for r in two if r[0] == 0] != [r[4] for r in two if r[0] == 1]


def test_workers_false_leaves_dataloader_alone():
    seed_everything(7, workers=False)
    loader = _loader(Draws())
    list(loader)
    assert loader.worker_init_fn is None


def test_no_collisions_over_a_large_grid():
    torch_seeds, numpy_words = set(), set()
    n = 0
    for rank in range(64):
        for worker in range(16):
            for epoch in range(100):
                s = derive(3, "worker", rank=rank, worker=worker, epoch=epoch)
                torch_seeds.add(s.torch)
                numpy_words.add(tuple(s.numpy))
                n += 1
    assert len(torch_seeds) == n == len(numpy_words)


def test_additive_offsets_would_collide_but_the_tree_does_not():
    # Megatron-style seed + 100*pp + 10*dp: (pp=0, dp=10) and (pp=1, dp=0) share a seed.
    assert 0 + 100 * 0 + 10 * 10 == 0 + 100 * 1 + 10 * 0
    assert derive(0, "init", pp=0, dp=10).torch != derive(0, "init", pp=1, dp=0).torch


def test_derivation_rejects_bad_input():
    with pytest.raises(ValueError):
        derive(-1, "x")
    with pytest.raises(ValueError):
        derive(2**128, "x")
    with pytest.raises(TypeError):
        derive(0, "x", rank=1.0)
    with pytest.raises(TypeError):
        derive(0, "x", rank=True)


def test_same_root_same_streams_in_fresh_process_with_other_hashseed(run_python):
    code = (
        "import json, random, numpy as np, torch\n"
        "from torchrepro import seed_everything\n"
        "plan = seed_everything(2024, rank=3)\n"
        "plan.stream('worker', rank=3, worker=1, epoch=2)\n"
        "print(json.dumps({'plan': plan.to_json(), 'draws': [random.random(), float(np.random.rand()),"
        " float(torch.rand(()))]}))\n"
    )
    out = [json.loads(run_python(code, env={"PYTHONHASHSEED": h}).stdout) for h in ("1", "2")]
    assert out[0] == out[1]
    plan = seed_everything(2024, rank=3)
    plan.stream("worker", rank=3, worker=1, epoch=2)
    assert out[0]["plan"] == json.loads(json.dumps(plan.to_json()))


def test_global_stream_shared_across_ranks_fork_stream_per_rank():
    inits, drops = [], []
    for rank in (0, 1):
        plan = seed_everything(11, rank=rank)
        inits.append(torch.nn.Linear(4, 4).weight.detach().clone())
        with plan.fork("dropout"):
            drops.append(torch.rand(5))
    assert torch.equal(inits[0], inits[1])
    assert not torch.equal(drops[0], drops[1])


def test_fork_continues_its_stream_and_restores_outer_state():
    plan = seed_everything(5)
    outer = torch.get_rng_state()
    with plan.fork("noise"):
        a = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outer)
    with plan.fork("noise"):
        b = torch.rand(3)
    reference = plan.stream("noise", rank=0).torch_generator()
    assert torch.equal(torch.cat([a, b]), torch.rand(6, generator=reference))
    with plan.fork("noise", shared=True) as shared:
        pass
    assert dict(shared.coords) == {}


def test_plan_json_and_str_list_every_stream():
    plan = seed_everything(9, rank=2)
    plan.make_generator("sampler")
    doc = json.loads(json.dumps(plan.to_json()))
    roles = {s["role"] for s in doc["streams"]}
    assert {"global", "sampler"} <= roles and doc["rank"] == 2
    assert "sampler" in str(plan)
