"""`torchrepro repro`: a compiled graph saved by a probed run, written out as a standalone script
that re-runs it (run to run, and against eager) with neither the training script nor torchrepro."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchrepro.capture.graph_probe import GraphProbe, _Call, save_graph
from torchrepro.capture.repro_script import call, load_graph, load_saved, same_outputs
from torchrepro.eventlog.event_reader import read_events

SCRIPTS = Path(__file__).parents[1] / "scripts"
SITE = str(Path(torch.__file__).parents[1])  # torch's site-packages, without its .pth files (torchrepro's among them)


def _torchrepro(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchrepro", *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )


def _isolated(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -I -S`` (no PYTHONPATH, no user site, no .pth files: not the editable torchrepro)
    with torch's site-packages on the path."""
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path.append({SITE!r}); {code}"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=900,
    )


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x, n: int):
        return torch.ops.aten.mm.default(x.t(), x) + self.offset * n, torch.ops.aten.sum.default(x)


def test_a_saved_graph_loads_back_and_computes_the_same(tmp_path):
    gm = torch.fx.symbolic_trace(Scaled())
    x = torch.randn(4, 6).t()  # not contiguous: its strides are rebuilt
    saved = [x.clone().t().contiguous().t(), 3]
    call_ = _Call("0/0", "forward", lambda args: gm(*args), saved, torch.random.get_rng_state(), [])
    save_graph(tmp_path / "g", gm, call_, GraphProbe(compile_id="0/0", graph="forward", repeats=2, threads=1))
    spec = json.loads((tmp_path / "g" / "inputs.json").read_text())
    assert spec["constants"] == ["offset"] and spec["inputs"][1] == {"kind": "value", "value": 3}
    assert spec["inputs"][0]["stride"] == list(x.stride())
    saved, tensors, rng = load_saved(tmp_path / "g")
    graph = load_graph(saved, tensors)
    assert same_outputs(call(graph, saved.inputs, tensors, rng), list(gm(x, 3)))
    assert (tmp_path / "g" / "inputs.safetensors").exists() and "class Graph(torch.nn.Module)" in (
        tmp_path / "g" / "graph.py"
    ).read_text()


def test_a_run_without_saved_graphs_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "run").mkdir()
    proc = _torchrepro(tmp_path, "repro", "run")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("torchrepro: error: run holds no saved compiled graph")


@pytest.mark.inductor
@pytest.mark.slow
def test_the_reproducer_runs_without_torchrepro_and_shows_compiled_vs_eager(tmp_path):
    run = _torchrepro(tmp_path, "run", "--probe-repeats", "1", "--out", "run", str(SCRIPTS / "gpt_loss.py"), "1")
    assert run.returncode == 0, run.stderr[-2000:]
    # the backward graph against the same FX graph run eagerly: the gradient computed first that differs
    (backward,) = [
        e
        for e in read_events(tmp_path / "run" / "rank-0" / "events.jsonl").events
        if isinstance(e, GraphProbe) and e.graph == "backward"
    ]
    head = next(
        i
        for i, line in enumerate((SCRIPTS / "gpt_loss.py").read_text().splitlines(), 1)
        if "logits = self.head(" in line
    )
    assert backward.eager_differing and backward.eager_explained["parameter"] == "head.weight"
    assert backward.eager_explained["source"].endswith(f"gpt_loss.py:{head}")
    wrong = _torchrepro(tmp_path, "repro", "run", "--graph", "9/9/forward")
    assert wrong.returncode == 2 and "saved: 0/0/backward, 0/0/forward" in wrong.stderr
    made = _torchrepro(tmp_path, "repro", "run", "--graph", "0/0/forward", "--out", "out")
    assert made.returncode == 0, made.stderr
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "graph.py",
        "inputs.json",
        "inputs.safetensors",
        "meta.json",
        "repro.py",
    ]
    assert _isolated("import torchrepro", tmp_path).returncode == 1  # torchrepro cannot be imported there
    script = str(out / "repro.py")
    proc = _isolated(
        f"sys.argv = [{script!r}, '--runs', '3']; import runpy; runpy.run_path(sys.argv[0], run_name='__main__')",
        tmp_path,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]  # reproduced: compiled differs from eager
    assert "COMPILED VS EAGER: DIFFERS: output(s) [0" in proc.stdout
    assert "run to run: 3 calls bit for bit the same" in proc.stdout  # one thread: no race


class Gelu(torch.nn.Module):
    def forward(self, x):
        return (torch.ops.aten.gelu.default(x),)


def test_bisect_names_the_decomposition_that_makes_compiled_differ_from_eager(tmp_path):
    """aten.gelu compiled differs from eager in the last bits, from its decomposition on (torch 2.13 CPU)."""
    gm = torch.fx.symbolic_trace(Gelu())
    x = torch.randn(1000, 37, generator=torch.Generator().manual_seed(0))
    call_ = _Call("0/0", "forward", lambda args: gm(*args), [x], torch.random.get_rng_state(), [])
    save_graph(
        tmp_path / "run" / "rank-0" / "graphs" / "0_0-forward",
        gm,
        call_,
        GraphProbe(compile_id="0/0", graph="forward", threads=1),
    )
    proc = _torchrepro(tmp_path, "repro", "run", "--bisect")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bisect: backend aot_eager_decomp_partition, subsystem decomposition, application 0 (" in proc.stdout
    assert "aten.gelu" in proc.stdout.splitlines()[-1]
