"""A log whose writer could not write it (a full disk, a quota) is said to be that, never a killed
process: the end record capture puts in the room it kept beside the log (``end.json``,
eventlog.event_writer.ReservedEnd) is read as the log's end, and the reports name the failed write;
a room left blank (a writer that was killed) means nothing. On logs written here by hand (the full
disk for real: tests/e2e/test_outputs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchrepro.analysis.doctor import analyse
from torchrepro.analysis.kept_steps import StepReducer
from torchrepro.analysis.verdict import ending
from torchrepro.eventlog.event_reader import read_events
from torchrepro.eventlog.event_writer import EventWriter, ReservedEnd
from torchrepro.eventlog.events import END_FILE, RESERVED_END, WRITE_FAILED, End, Header, Step

FAILED = End(step=3, exit_code=None, status=WRITE_FAILED, error="ENOSPC rank-0/events.jsonl", duration_s=1.0)


def _log(folder: Path, *, reserved: End | None, kept: bool = True) -> Path:
    """A rank's log of three steps and no end record, its room for one written with ``reserved``
    (``kept=False``: no room at all)."""
    with EventWriter(folder / "events.jsonl") as writer:
        room = ReservedEnd.make(folder) if kept else None  # (as capture does: once the log is open)
        writer.write(Header(world_size=1))
        for i in range(3):
            writer.write(Step(index=i, loss=1.0, time_s=0.1))
    if room is not None:
        if reserved is not None:
            assert room.write(reserved)
        room.close()
    return folder / "events.jsonl"


def test_the_end_record_kept_beside_the_log_is_its_end(tmp_path):
    path = _log(tmp_path / "rank-0", reserved=FAILED)
    assert (tmp_path / "rank-0" / END_FILE).stat().st_size == RESERVED_END  # written in place, not grown
    log = read_events(path)
    assert log.end == FAILED and log.problems == []
    report = analyse({}, [read_events(path, reduce=StepReducer())], [])
    (finding,) = [f for f in report.findings if f.severity == "error"]
    assert finding.code == "EVENT_LOG_WRITE_FAILED"
    assert finding.title == (
        "rank 0: the disk was full (ENOSPC) while writing rank-0/events.jsonl; nothing after step 2 was recorded"
    )
    assert report.verdict_line.startswith("PROBLEMS") and "SIGKILL" not in json.dumps(report.to_json())
    assert "RANK_CRASHED" not in {f.code for f in report.findings}
    (said,) = ending("a", {}, [log]).problems
    assert (
        said
        == "rank 0: the disk was full (ENOSPC) while writing rank-0/events.jsonl; only its first 3 step(s) were recorded"
    )


@pytest.mark.parametrize("kept", [True, False], ids=["room-left-blank", "no-room"])
def test_without_an_end_record_written_the_log_has_no_end(tmp_path, kept):
    log = read_events(_log(tmp_path / "rank-0", reserved=None, kept=kept))  # a writer killed before it wrote one
    assert log.end is None
    assert ending("a", {}, [log]).problems == [
        "rank 0: no end record (the process was killed, or the log is truncated)"
    ]


def test_a_log_with_its_own_end_ignores_the_room(tmp_path):
    path = _log(tmp_path / "rank-0", reserved=FAILED)
    with EventWriter(path) as writer:
        writer.write(End(exit_code=0))
    assert read_events(path).end.status == "ok"


@pytest.mark.parametrize(
    "data", [b"{", b'{"kind": "step", "index": 1}', b"x" * 600, b'{"kind": "end", "status": 5}'], ids=str
)
def test_a_room_holding_anything_else_means_nothing(tmp_path, data):
    path = _log(tmp_path / "rank-0", reserved=None)
    (tmp_path / "rank-0" / END_FILE).write_bytes(data)
    assert read_events(path).end is None


def _interrupted(tmp_path: Path, reserved: End | None) -> tuple[str, str]:
    log = read_events(_log(tmp_path / "rank-0", reserved=reserved), reduce=StepReducer())
    meta = {"supervisor": {"pid": 1, "host": "elsewhere"}, "interrupted": {"supervisor_pid": 1}}
    report = analyse(meta, [log], [])
    (finding,) = [f for f in report.findings if f.code == "RUN_INTERRUPTED"]
    return report.verdict_line, finding.hint


def test_an_interrupted_run_whose_ranks_could_not_write_is_not_called_killed(tmp_path):
    verdict, hint = _interrupted(tmp_path, FAILED)
    assert verdict.startswith("INTERRUPTED") and "SIGKILL" not in hint
    assert hint.startswith(
        "The ranks' event logs could not be written (rank 0: the disk was full (ENOSPC) while writing "
        "rank-0/events.jsonl): that is most likely what ended torchrepro too."
    )


def test_sigkill_stays_a_guess_said_only_when_nothing_recorded_says_why(tmp_path):
    verdict, hint = _interrupted(tmp_path, None)
    assert verdict.startswith("INTERRUPTED") and hint.startswith("torchrepro was most likely killed by SIGKILL")
    assert "a guess: no stop signal and no failed write was recorded" in hint
