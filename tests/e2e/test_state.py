"""One view of rank and world (_dist), one place for process state (_state), no seed <-> rng cycle."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchrepro import _dist, _state, make_generator, seed_everything
from torchrepro.seed import active_plan
from torchrepro.capture.session import CaptureConfig, CaptureSession, active_session
from torchrepro.rng import RngState, register, registered

SRC = Path(__file__).resolve().parents[2] / "src" / "torchrepro"
RANK_VARS = (*{v for family in (_dist.TORCHRUN, _dist.SLURM) for names in family.values() for v in names},)


def _fresh_env(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    return {**env, **variables}


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    _state.reset()


# --- _dist ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (0, 1, None, None, "default")),
        ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1"}, (3, 4, 1, 1, "env")),
        ({"LOCAL_RANK": "2", "WORLD_SIZE": "4", "NODE_RANK": "0"}, (0, 4, 2, 0, "env")),  # Lightning's children
        ({"GROUP_RANK": "2", "NODE_RANK": "5", "RANK": "9", "WORLD_SIZE": "16"}, (9, 16, None, 2, "env")),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2"}, (5, 8, 1, 2, "env")),
        # torchrun's variables win, and are never mixed with SLURM's
        (
            {
                "RANK": "1",
                "WORLD_SIZE": "2",
                "SLURM_PROCID": "5",
                "SLURM_NTASKS": "8",
                "SLURM_LOCALID": "3",
                "SLURM_NODEID": "4",
            },
            (1, 2, None, None, "env"),
        ),
        ({"RANK": "", "WORLD_SIZE": " "}, (0, 1, None, None, "default")),  # empty is unset
    ],
)
def test_environment_precedence(environ, expected):
    p = _dist.from_env(environ)
    assert (p.rank, p.world_size, p.local_rank, p.node, p.source) == expected


@pytest.mark.parametrize("environ", [{"RANK": "two"}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "x"}])
def test_a_value_that_is_no_integer_is_named(environ):
    name, value = next((k, v) for k, v in environ.items() if not v.isdigit())
    with pytest.raises(ValueError, match=f"{name}='{value}' is not an integer"):
        _dist.from_env(environ)


_CALL_SITES = """
import json, torch
from torchrepro import _dist, checkpoint, seed_everything
from torchrepro.capture.session import CaptureConfig, CaptureSession
from torchrepro.rng import RngState
plan, state = seed_everything(0), RngState.capture()
session = CaptureSession(CaptureConfig(run_dir="run"))
checkpoint.save("ckpt", step=1)
resume = checkpoint.load("ckpt")
print(json.dumps({"dist": [_dist.rank(), _dist.world_size(), _dist.local_rank(), _dist.node()],
                  "seed": [plan.rank, plan.world_size], "rng": [state.rank, state.world_size],
                  "session": [session.rank, session.world_size, session.local_rank, session.rank_from],
                  "checkpoint": resume.world_size}))
"""


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [0, 1, 0, None, "default"]),
        ({"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "GROUP_RANK": "1"}, [2, 3, 0, 1, "env"]),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODEID": "1"}, [1, 2, 1, 1, "env"]),  # local: the rank
    ],
)
def test_every_call_site_reads_the_environment_alike(tmp_path, env, expected):
    out = json.loads(_python(_CALL_SITES, _fresh_env(**env), tmp_path).stdout)
    rank, world, local, node, source = expected
    assert out == {
        "dist": [rank, world, local, node],
        "seed": [rank, world],
        "rng": [rank, world],
        "session": [rank, world, local, source],
        "checkpoint": world,
    }
    assert (tmp_path / "ckpt" / f"position-rank{rank}.json").is_file()


_GLOO = """
import json, os, sys
import torch.distributed as dist
import torch.multiprocessing as mp

def main(rank, out):
    os.environ.update(RANK="7", WORLD_SIZE="9", LOCAL_RANK=str(rank), GROUP_RANK="3")  # the group must win
    from torchrepro import _dist, checkpoint, seed_everything
    from torchrepro.capture.session import CaptureConfig, CaptureSession
    from torchrepro.rng import RngState
    before = _dist.placement()
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"), rank=rank, world_size=2)
    try:
        here = _dist.placement()
        plan, state = seed_everything(0), RngState.capture()
        session = CaptureSession(CaptureConfig(run_dir=os.path.join(out, "run")))
        checkpoint.save(os.path.join(out, "ckpt"), step=1)
        dist.barrier()
        resume = checkpoint.load(os.path.join(out, "ckpt"))
        result = {"before": [before.rank, before.world_size, before.source],
                  "group": [here.rank, here.world_size, here.local_rank, here.node, here.source],
                  "seed": [plan.rank, plan.world_size], "rng": [state.rank, state.world_size],
                  "session": [session.rank, session.world_size, session.local_rank, session.rank_from],
                  "checkpoint": resume.world_size}
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fp:
            json.dump(result, fp)
    finally:
        dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(main, args=(sys.argv[1],), nprocs=2)
"""


@pytest.mark.distributed
def test_an_initialised_process_group_wins_over_the_environment(tmp_path):
    script = tmp_path / "gloo.py"
    script.write_text(_GLOO)
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=_fresh_env(),
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out == {
            "before": [7, 9, "env"],
            "group": [rank, 2, rank, 3, "process_group"],
            "seed": [rank, 2],
            "rng": [rank, 2],
            "session": [rank, 2, rank, "process_group"],
            "checkpoint": 2,
        }
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("position-*")) == [
        "position-rank0.json",
        "position-rank1.json",
    ]


# --- _state -----------------------------------------------------------------------------------


def test_the_seed_plan_and_its_fork_streams_live_in_the_state():
    plan = seed_everything(3)
    assert active_plan() is plan and _state.seed_root() == 3 and _state.fork_states() == {}
    with plan.fork("dropout"):
        torch.rand(2)
    assert list(_state.fork_states()) == ["dropout[rank=0]"]
    assert list(RngState.capture().forks) == ["dropout[rank=0]"]
    again = seed_everything(3)  # a new plan starts its streams anew
    assert active_plan() is again and _state.fork_states() == {}


def test_restoring_fork_streams_writes_the_active_plans():
    plan = seed_everything(5)
    with plan.fork("noise"):
        torch.rand(3)
    saved = RngState.capture()
    with plan.fork("noise"):
        expected = torch.rand(4)
    saved.restore()
    with plan.fork("noise"):
        assert torch.equal(torch.rand(4), expected)


def test_generators_are_registered_in_the_state():
    g = register("sampler", torch.Generator().manual_seed(1))
    plan = seed_everything(0)
    made = plan.make_generator("shuffle")
    assert registered() == {"sampler": g, "shuffle": made} == _state.generators()
    assert set(RngState.capture().generators) == {"sampler", "shuffle"}


def test_the_capture_session_is_recorded_while_it_runs(tmp_path):
    session = CaptureSession(CaptureConfig(run_dir=tmp_path))
    session.start()
    try:
        assert active_session() is session is _state.session()
    finally:
        session.stop(0)
    assert active_session() is None and _state.session() is None


def test_reset_forgets_everything(tmp_path):
    plan = seed_everything(1)
    with plan.fork("dropout"):
        pass
    register("g", torch.Generator())
    _state.set_session(CaptureSession(CaptureConfig(run_dir=tmp_path)))
    _state.reset()
    assert (active_plan(), _state.seed_root(), _state.fork_states(), _state.generators(), _state.session()) == (
        None,
        None,
        {},
        {},
        None,
    )
    with pytest.raises(RuntimeError, match="seed_everything"):
        make_generator("x")


# --- imports ----------------------------------------------------------------------------------


_USES = {  # importing a module, then using it, never imports the other
    "torchrepro.rng": "from torchrepro.rng import RngState, live_fingerprints\n"
    "state = RngState.capture(); state.restore(); live_fingerprints()",
    "torchrepro.seed": "from torchrepro.seed import seed_everything, worker_rng\n"
    "seed_everything(0).make_generator('sampler'); worker_rng()",
    "torchrepro._dist": "import torchrepro._dist as d; d.placement(); d.local_rank(); d.node()",
    "torchrepro._state": "import torchrepro._state as s; s.reset(); s.seed_root(); s.session()",
}


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("torchrepro.rng", "torchrepro.seed"),
        ("torchrepro.seed", "torchrepro.rng"),
        ("torchrepro._dist", "torch"),
        ("torchrepro._state", "torch"),
    ],
)
def test_a_module_in_use_does_not_import(tmp_path, module, absent):
    code = f"import sys\n{_USES[module]}\nprint({absent!r} in sys.modules)"
    assert _python(code, _fresh_env(), tmp_path).stdout.strip() == "False"


def test_seed_and_rng_do_not_import_each_other_even_lazily():
    def imports(name: str) -> set[str]:
        tree = ast.parse((SRC / name).read_text())
        return {
            node.module or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }

    assert "rng" not in imports("seed.py") and "seed" not in imports("rng.py")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in ("_dist", "_state")


@pytest.mark.parametrize("name", ["seed.py", "rng.py", "checkpoint.py", "_dist.py", "_state.py", "capture/session.py"])
def test_no_private_name_is_read_from_another_module(name):
    tree = ast.parse((SRC / name).read_text())
    relative = [
        alias for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level > 0 for alias in node.names
    ]
    modules = {alias.asname or alias.name for alias in relative}
    imported = [alias.name for alias in relative if _private(alias.name)]
    read = [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and _private(node.attr)
    ]
    assert imported == [] and read == []


REBINDING_ALLOWED = {"_state.py", "rng_raw.py", "render/html.py"}


def state_breaches(name: str, source: str) -> list[str]:
    """Where module ``name`` keeps process state otherwise than the one way: ``global`` rebinds
    module state (only ``_state`` may, and two caches of pure lookups: ``rng_raw``'s calibrated
    memory layouts, ``render/html``'s Jinja environment); any other module declares what it keeps
    once, at its top level, as ``NAME = _state.kept(...)``, which :func:`torchrepro._state.reset`
    makes anew."""
    tree = ast.parse(source)
    out = [f"{name}:{node.lineno}: global" for node in ast.walk(tree) if isinstance(node, ast.Global)]
    if name in REBINDING_ALLOWED:
        out = []
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "kept"
    ]
    declared = [
        node.value
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call) and node.value in calls
    ]
    out += [f"{name}:{call.lineno}: kept() not as a top-level NAME = ..." for call in calls if call not in declared]
    if len(declared) > 1:
        out.append(f"{name}: {len(declared)} declarations of kept state (one per module)")
    return out


def _kept_declarers() -> dict[str, int]:
    """Module name -> how many states it declares with ``_state.kept``."""
    found = {}
    for path in SRC.rglob("*.py"):
        count = path.read_text().count("_state.kept(")
        if count and path.name != "_state.py":
            found[".".join(("torchrepro", *path.relative_to(SRC).with_suffix("").parts))] = count
    return found


def test_the_rule_on_module_state_can_fail():
    assert state_breaches("m.py", "def f():\n    global X\n    X = 1\n") == ["m.py:2: global"]
    assert state_breaches("m.py", "def f():\n    return _state.kept(list)\n") == [
        "m.py:2: kept() not as a top-level NAME = ..."
    ]
    assert state_breaches("m.py", "A = _state.kept(list)\nB = _state.kept(dict)\n") == [
        "m.py: 2 declarations of kept state (one per module)"
    ]
    assert state_breaches("m.py", "A: _state.Kept[list[int]] = _state.kept(list)\n") == []


def test_process_state_is_kept_only_in_the_state_module_or_declared_there():
    breaches = [
        problem
        for path in sorted(SRC.rglob("*.py"))
        for problem in state_breaches(str(path.relative_to(SRC)), path.read_text())
    ]
    assert breaches == []


def test_reset_makes_every_declared_state_anew_but_the_guardian():
    import importlib

    declarers = _kept_declarers()
    assert {"torchrepro._compat", "torchrepro.seed", "torchrepro.commands.launcher"} <= set(declarers)
    for module in declarers:
        importlib.import_module(module)
    assert len(_state._KEPT) == sum(declarers.values())  # each declared once, at import
    marker = object()
    before = [declared.value for declared in _state._KEPT]
    for declared in _state._KEPT:
        declared.value = marker
    try:
        _state.reset()
        kept = [declared for declared in _state._KEPT if declared.value is marker]
        assert [d.survives_reset for d in kept] == [
            True
        ]  # commands.launcher's state: its guardian is a running process
        assert all(d.value is not marker and d.value == d.factory() for d in _state._KEPT if not d.survives_reset)
    finally:
        for declared, value in zip(_state._KEPT, before):
            declared.value = value
