"""The JSON that capture writes beside the events has the keys its TypedDicts (``eventlog/payloads.py``)
declare: the type checker trusts those declarations, these tests hold the writers to them (an op replay,
a graph check and a header's capture settings here; a kernel replay in test_compiled_nondeterminism.py)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import Header
from torchrepro.eventlog.payloads import CaptureSettings, GraphCheck, NodeInfo, OpRecord


def fits(value: Mapping[str, object], typed: type) -> bool:
    """Whether ``value`` has every key the TypedDict ``typed`` requires and no key it does not declare."""
    required, optional = typed.__required_keys__, typed.__optional_keys__
    return bool(required <= value.keys() <= required | optional)


def test_fits_tells_a_missing_or_an_extra_key():
    record = {"i": 0, "op": "aten.add.Tensor", "module": None, "phase": "forward", "source": None}
    assert fits({**record, "inputs": [], "outputs": None}, OpRecord)
    assert not fits(record, OpRecord)  # no digests
    assert not fits({**record, "inputs": [], "outputs": None, "extra": 1}, OpRecord)
    assert fits({}, CaptureSettings) and not fits({"seeds": 1}, CaptureSettings)  # every key optional


def test_an_op_replay_records_each_op_as_an_op_record():
    from torchrepro.capture.ops import OpRecorder

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    with OpRecorder() as recorder:
        model(torch.randn(5, 3)).sum().backward()
    assert recorder.ops and all(fits(op, OpRecord) for op in recorder.ops)
    assert {op["phase"] for op in recorder.ops} == {"forward", "backward"}
    assert [op["i"] for op in recorder.ops] == list(range(len(recorder.ops)))


def test_a_header_keeps_its_capture_settings_through_the_log(tmp_path):
    settings: CaptureSettings = {"seed": 3, "compile_mode": None, "steps": {"grads": True}, "rank_from": "env"}
    write_all(tmp_path / "rank-0" / "events.jsonl", [Header(config=settings)])
    header = read_events(tmp_path / "rank-0" / "events.jsonl").header
    assert header is not None and header.config == settings and fits(header.config, CaptureSettings)


def test_a_graph_check_names_the_differing_output_as_a_graph_check():
    from torchrepro.capture.ops import GraphChecker

    def fn(x):
        noise = torch.rand_like(x)
        return x * 2, noise + x

    reference = torch.fx.symbolic_trace(fn)
    x = torch.ones(3)
    checker = GraphChecker()
    checker._compare("0/0", reference, (x * 2, x), (x * 2, x + 1))
    (entry,) = checker.results
    assert fits(entry, GraphCheck) and fits(entry["random_nodes"][0], NodeInfo)
    # the keys in the order the replay file had them before they were typed: its bytes are unchanged
    assert list(entry) == [
        "compile_id", "outputs", "random_nodes", "first_differing_output", "max_abs",
        "node", "target", "module", "source", "depends_on_random",
    ]  # fmt: skip
    assert entry["first_differing_output"] == 1 and entry["max_abs"] == 1.0 and entry["target"] == "add"
    assert [r["node"] for r in entry["depends_on_random"]] == ["rand_like"]
