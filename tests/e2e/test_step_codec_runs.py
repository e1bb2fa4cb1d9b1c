"""The steps.bin codec in real processes: one started with only ``PYTHONPATH=src`` finds the C
extension, and a captured run's steps.bin reads the same with either codec and the Python encoder
writes it again byte for byte (the codecs on made-up values: tests/unit/test_step_codec.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import NOISE_CHECK_GROUP
from step_codecs import exact, implementation, needs_c

from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.events import Step, field_names
from torchrepro.eventlog.stepstream import Decoder, Encoder


ROOT = Path(__file__).resolve().parents[2]


def test_a_process_started_with_pythonpath_src_finds_the_extension(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("TORCHREPRO_PURE_PYTHON_CODEC", None)
    code = "from torchrepro.eventlog import stepstream; print(stepstream._C.__name__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.stdout.strip() == "torchrepro.eventlog._stepcodec", out.stderr


@needs_c
@pytest.mark.xdist_group(NOISE_CHECK_GROUP)  # the worker that makes noise_check once
def test_captured_runs_read_the_same_with_either_and_python_writes_them_again(noise_check):
    """The runs of ``torchrepro check`` of a small compiled training script (tests/e2e/conftest.py's
    noise_check: every parameter fingerprinted every step; steps.bin written by the C encoder):
    both decoders read the same steps, and the Python encoder writes the same bytes."""
    proc, out = noise_check
    streams = sorted(out.rglob("steps.bin"))
    assert proc.returncode == 1 and len(streams) >= 3, proc.stderr[-2000:]  # its two runs and a replay
    sealed: list[bool] = []
    for stream in streams:
        logs = {}
        for c in (True, False):
            with implementation(c):
                logs[c] = [s.to_json() for s in read_events(stream.with_name("events.jsonl")).of(Step)]
        assert logs[True] and exact(logs[True]) == exact(logs[False])
        raw = stream.read_bytes()
        with implementation(False):
            decoder = Decoder(dict)
            records = decoder.feed(raw) + decoder.finish()
            encoder = Encoder(field_names(Step))
        assert not decoder.damaged and decoder.fields == encoder.fields
        again = encoder.header() + b"".join(encoder.encode([lines, *fields.values()]) for lines, fields in records)
        assert raw in (again, again + encoder.seal())  # (sealed where the writer closed it; a replay is killed)
        sealed.append(raw != again)
    assert any(sealed), sealed  # (the runs end: their writers close the logs)
