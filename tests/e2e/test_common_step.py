"""doctor's common step (one process, no digests) is written from its values, without building its
``Step`` (``EventWriter.write_step``, docs/evidence/performance.md "What doctor costs a step"): the same
bytes on disk as the ``Step`` written the usual way, whatever the values, and the usual way
wherever the fast path does not apply (listeners, the first step, several backward() calls)."""

from __future__ import annotations

import json
import math

from torchrepro.eventlog.event_codec import COMMON_STEP
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import EventWriter
from torchrepro.eventlog.events import Header, Step
from torchrepro.eventlog.stepstream import KEYFRAME_EVERY


def _common_values(i: int) -> dict:
    """The fields of common step ``i``: losses that move, repeat, are NaN, inf, -0.0, None, huge."""
    losses = [2.5 - i * 1e-3, 2.5 - i * 1e-3, float("nan"), float("inf"), -0.0, None, 1e300, 0.1]
    return {
        "t": 1.8e9 + i * 0.0173,
        "rank": 3,
        "index": i,
        "loss": losses[i % len(losses)],
        "backward_calls": 0 if i % 8 == 5 else 1,
        "time_s": round(0.02 + (i % 7) * 1e-5, 6),
        "compiles": 1 if i % 50 == 0 else 0,
    }


def test_a_common_step_written_from_its_values_is_the_bytes_of_its_step(tmp_path):
    """Over a keyframe's worth of records and more, with non-finite and missing losses, events
    between the steps, and a value a record cannot hold (a complex loss: a JSON line instead)."""
    fast_writer, usual_writer = (EventWriter(tmp_path / name / "events.jsonl") for name in ("fast", "usual"))
    fast = 0
    for writer in (fast_writer, usual_writer):
        writer.write(Header(t=1.8e9))
    for i in range(KEYFRAME_EVERY + 40):
        values = _common_values(i)
        if i == 77:
            values["loss"] = complex(1, 2)
        step = Step(step=values["index"], **values)
        usual_writer.write(step)
        if fast_writer.write_step(**values):
            fast += 1
        else:
            fast_writer.write(step)
        if i % 60 == 59:
            for writer in (fast_writer, usual_writer):
                writer.write(Header(t=1.8e9))  # any other event: a line between records
    fast_writer.close()
    usual_writer.close()
    assert fast == KEYFRAME_EVERY + 40 - 2  # all but the first (steps.bin not open yet) and the complex loss
    for name in ("steps.bin", "events.jsonl"):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "usual" / name).read_bytes(), name
    log = read_events(tmp_path / "fast" / "events.jsonl")
    got = {s.index: s for s in log.of(Step)}
    assert sorted(got) == [i for i in range(KEYFRAME_EVERY + 40) if i != 77] and log.bad_lines == 1  # no JSON type
    assert math.isnan(got[2].loss) and got[3].loss == math.inf and got[5].loss is None
    assert math.copysign(1, got[4].loss) == -1 and got[288].loss == 2.5 - 288 * 1e-3
    assert COMMON_STEP == tuple(_common_values(0))


def test_a_writer_with_listeners_takes_the_step():
    """A listener (the live view, OpenTelemetry) gets every event as a ``Step``: no fast path."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        seen: list[object] = []
        with EventWriter(Path(tmp) / "events.jsonl") as writer:
            writer.listeners.append(seen.append)
            writer.write(Step(index=0))
            assert writer.write_step(**_common_values(1)) is False and len(seen) == 1


LOOP = r"""
import json, itertools
from pathlib import Path
import torch
import torchrepro.capture.steps as steps
from torchrepro.capture.session import CaptureConfig, CaptureSession
from torchrepro.capture.steps import StepConfig
from torchrepro.digests import fingerprint
from torchrepro.eventlog.event_writer import EventWriter

class Clock:  # the same times in every run, so that both ways can write the same bytes
    def __init__(self):
        self.ticks = itertools.count()
    def perf_counter(self):
        return next(self.ticks) * 0.0125
    def time(self):
        return 1.8e9 + next(self.ticks) * 0.0173

fast = [0]
write_step = EventWriter.write_step
def counted(self, *args):
    written = write_step(self, *args)
    fast[0] += written
    return written
EventWriter.write_step = counted

def train(name, listeners):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    session = None
    if name:
        steps.time = Clock()
        config = CaptureConfig(run_dir=Path(name), steps=StepConfig(ranks_only=True))  # doctor's
        session = CaptureSession(config, rank=(0, 1, 0), listeners=listeners)
        session.start()
    printed = []
    for i in range(30):
        optimizer.zero_grad()
        calls = 2 if i % 10 == 4 else 0 if i % 10 == 7 else 1  # accumulation, and a step without backward()
        for _ in range(calls):
            loss = torch.nn.functional.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1))
            if i == 12:
                loss = loss + torch.tensor(float("nan"))  # a NaN loss is recorded as any other (its gradients are not NaN)
            loss.backward()
        printed.append(loss.item() if calls == 1 else None)
        optimizer.step()
    if session is not None:
        session.stop(0)
    return fingerprint(model), printed

finals = {}
train("warm", ())  # once a process: the private torch APIs probed (events at start in later sessions)
for name, listeners in (("fast", ()), ("usual", (lambda event: None,)), ("", ())):
    before = fast[0]
    finals[name or "none"], printed = train(name, listeners)
    print(json.dumps({"run": name, "fast": fast[0] - before}))
print(json.dumps({"finals": finals, "printed": printed}))
"""


def test_doctor_steps_are_the_same_bytes_either_way_and_training_is_unchanged(run_python, tmp_path):
    """The same loop under doctor's capture twice, the clock made repeatable: written from the
    values (every step but the first, the accumulated ones) or, with a listener, as ``Step``
    events, ``steps.bin`` is the same bytes; the parameters are those of the loop without capture."""
    (tmp_path / "loop.py").write_text(LOOP)
    lines = [json.loads(line) for line in run_python("import runpy; runpy.run_path('loop.py')").stdout.splitlines()]
    fast = {line["run"]: line["fast"] for line in lines[:3]}
    assert fast == {"fast": 30 - 1 - 3, "usual": 0, "": 0}  # the first step and the three of 2 backward() calls
    assert len(set(lines[3]["finals"].values())) == 1, lines[3]  # bit-identical training
    assert (tmp_path / "fast/rank-0/steps.bin").read_bytes() == (tmp_path / "usual/rank-0/steps.bin").read_bytes()
    got = read_events(tmp_path / "fast/rank-0/events.jsonl").of(Step)
    assert [s.index for s in got] == list(range(30)) and [s.backward_calls for s in got][:8] == [1, 1, 1, 1, 2, 1, 1, 0]
    printed = lines[3]["printed"]
    assert [s.loss for i, s in enumerate(got) if printed[i] is not None and i != 12] == [
        p for i, p in enumerate(printed) if p is not None and i != 12
    ]
    assert math.isnan(got[12].loss) and got[7].loss is None and got[4].loss_last is not None


BACKWARD_CLOCK = r"""
import json
from pathlib import Path
import torch
from torchrepro.capture.session import CaptureConfig, CaptureSession
from torchrepro.capture.steps import StepConfig

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
session = CaptureSession(CaptureConfig(run_dir=Path("run"), steps=StepConfig(ranks_only=True)))
session.start()
printed = []
for _ in range(20):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    with torch.no_grad():  # no optimizer: backward() is the step clock
        for p in model.parameters():
            p -= 0.1 * p.grad
            p.grad = None
    printed.append(loss.item())
session.stop(0)
print(json.dumps(printed))
"""


def test_backward_clocked_common_steps_are_written_from_their_values(run_python, tmp_path):
    """With no optimizer, backward() ends the step the previous one began (the last at the end):
    the steps, written from their values, hold the losses the script printed."""
    from torchrepro.eventlog.events import Capability

    (tmp_path / "clock.py").write_text(BACKWARD_CLOCK)
    printed = json.loads(run_python("import runpy; runpy.run_path('clock.py')").stdout.splitlines()[-1])
    log = read_events(tmp_path / "run/rank-0/events.jsonl")
    assert [c.note for c in log.of(Capability) if c.name == "step_clock"] == [
        "backward(): no torch.optim optimizer exists"
    ]
    assert [s.loss for s in log.of(Step)] == printed and [s.index for s in log.of(Step)] == list(range(20))


FORKED = r"""
import json, os
from pathlib import Path
from torchrepro.capture.session import CaptureConfig, CaptureSession
from torchrepro.eventlog.events import Capability

session = CaptureSession(CaptureConfig(run_dir=Path("run")))
session.start()
child = os.fork()
if child == 0:  # a DataLoader worker, say: capture stays quiet there
    session.emit(Capability(name="from_child", available=True))
    os._exit(0 if session.emit_step(1.8e9, 5, 0.5, 1, 0.01, 0) is False else 1)
_, status = os.waitpid(child, 0)
session.emit(Capability(name="from_parent", available=True))
session.stop(0)
print(json.dumps(os.waitstatus_to_exitcode(status)))
"""


def test_a_forked_child_writes_nothing(run_python, tmp_path):
    """The session's process id is read once and renewed in a forked child (no system call per
    event): what the child emits is dropped, what the parent emits after the fork is written."""
    from torchrepro.eventlog.events import Capability

    (tmp_path / "forked.py").write_text(FORKED)
    assert json.loads(run_python("import runpy; runpy.run_path('forked.py')").stdout.splitlines()[-1]) == 0
    names = [c.name for c in read_events(tmp_path / "run/rank-0/events.jsonl").of(Capability)]
    assert "from_parent" in names and "from_child" not in names
