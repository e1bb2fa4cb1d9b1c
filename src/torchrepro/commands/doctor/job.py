"""`torchrepro doctor`: run a script under capture (or import TORCH_TRACE logs), analyse, report."""

from __future__ import annotations

import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from ...analysis.compile_fixes import advise
from ...analysis.doctor import Budgets, analyse
from ...analysis.kept_steps import StepReducer
from ...errors import InputError, NotStarted, Stopped
from ...eventlog.event_reader import rank_logs, read_events, read_header
from ...eventlog.event_writer import write_all
from ...eventlog.events import EVENTS_FILE, Counters, End, Header
from ...runtime.follow import LAUNCHER_DIR
from ..launcher import ChildResult, child_env, launch, validate_script
from ...runtime.run_options import RunOptions
from ...eventlog.provenance import launch_meta
from ...eventlog.jsoncheck import schema_problem
from ...reports.doctor_report import DoctorReport
from ...reports.schema import schema_of
from ...eventlog.rundir import (
    RUN_FILE,
    claim_run_dir,
    create_run_dir,
    default_run_dir,
    load_run,
    read_json_file,
    supervisor_record,
    write_json,
)
from ...render.save import write_report

FIXES_DIR = "fixes"  # doctor --fixes: its runs, one folder each (commands.doctor.fixes)
FIXES_FILE = "compile_fixes.json"  # ... and its result, in that folder


def resumable(run_dir: Path, script: Path, args: list[str]) -> bool:
    """``run_dir`` holds a finished baseline of this script with these arguments: ``doctor
    --fixes`` continues there instead of running it again."""
    try:
        meta = json.loads((run_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(meta, dict)
        and meta.get("script") == str(script)
        and meta.get("args") == args
        and "ended" in meta
        and bool(rank_logs(run_dir))
    )


_FIXES_FIELDS = ("compile_fixes", "compile_fix_recommended", "compile_fix_note")


def attach(report: DoctorReport, run_dir: Path) -> None:
    """Give ``report`` the stored result of ``doctor --fixes`` in ``run_dir``, if there is one, and
    its findings the advice the fix runs measured (:func:`~torchrepro.analysis.compile_fixes.advise`);
    :class:`InputError` naming the file and its field when it breaks its schema (the doctor
    report's, for these fields)."""
    path = run_dir / FIXES_DIR / FIXES_FILE
    try:
        stored = read_json_file(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from None
    schema = schema_of("doctor")
    fields = {"type": "object", "properties": {k: schema["properties"][k] for k in _FIXES_FIELDS}}
    if (problem := schema_problem(stored, fields, schema)) is not None:
        raise InputError(f"{path}: {problem}")
    report.compile_fixes = stored.get("compile_fixes")
    report.compile_fix_recommended = stored.get("compile_fix_recommended")
    report.compile_fix_note = stored.get("compile_fix_note")
    report.findings = advise(report.findings, report.compile_fixes)


def analyse_run_dir(
    run_dir: Path, budgets: Budgets | None = None, store: bool = True, jobs: int | None = None
) -> DoctorReport:
    """Analyse a stored run; with ``store``, write its ``report.json`` (a run that has just ended;
    ``torchrepro report`` never replaces the stored one). Each rank's steps are reduced as it is
    read, by ``jobs`` reading processes (``None``: as :func:`~.rundir.load_run` chooses, saying so
    on stderr when it starts them)."""
    run = load_run(run_dir, keep=StepReducer, jobs=jobs, progress=_say)
    if all(log.unreadable for log in run.logs):
        raise InputError(f"{run.logs[0].path}: {run.logs[0].unreadable}")
    report = analyse(run.meta, run.logs, run.problems, budgets)
    attach(report, run_dir)  # doctor --fixes' result, stored beside its runs
    if store:
        write_report(run_dir, report)
    else:  # a signal that stopped the job then is the stored run's failure, not this command's
        report.reread = True
    return report


def _say(text: str) -> None:
    print(f"torchrepro: {text}", file=sys.stderr, flush=True)


# run.json as written here: open (launch_meta's fields, a fix run's own, what finish_meta adds)
RunMeta = dict[str, Any]


class StackFrame(TypedDict):
    """A frame of a stalled rank's Python stack (``run.json``'s ``stall.stacks``)."""

    file: str
    line: int
    function: str


def start_meta(script: Path, args: list[str], *, seed: int | None, world_size: int = 1, **extra: Any) -> RunMeta:
    """The ``run.json`` written before a run starts (completed by :func:`finish_meta`)."""
    from ..._compat import installed_torch_version

    return {
        **launch_meta(script),
        "script": str(script),
        "args": args,
        "seed": seed,
        "world_size": world_size,
        "torch_version": installed_torch_version(),
        "python_version": platform.python_version(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "supervisor": supervisor_record(),  # with no "ended" once it is gone: the job was interrupted
        **extra,
    }


_FRAME = re.compile(r'File "(.+)", line (\d+) in (.+)')


def parse_stacks(path: Path) -> list[StackFrame]:
    """The main thread's frames (most recent first) from a faulthandler dump."""
    if not path.exists():
        return []
    blocks = path.read_text(errors="replace").split("\n\n")
    main = next((b for b in blocks if "Current thread" in b or "Thread 0x" in b and "most recent call first" in b), "")
    return [{"file": f, "line": int(n), "function": fn.strip()} for f, n, fn in _FRAME.findall(main)]


def finish_meta(meta: RunMeta, result: ChildResult, run_dir: Path) -> RunMeta:
    """Complete ``run.json`` with how the run ended (``ended``: the supervisor's end record, see
    :func:`~torchrepro.eventlog.rundir.supervisor_lost`): per rank exit codes and stderr, a stall."""
    logs = rank_logs(run_dir)
    header = read_header(logs[0]) if logs else None
    meta.update(
        ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        exit_code=result.exit_code,
        stderr_tail=result.stderr_tail,
        env_fingerprint=header.env_fingerprint if header else None,
        rank_exit_codes={str(r): c for r, c in result.rank_exit_codes.items()},
        rank_stderr_tails={str(r): t[-15:] for r, t in result.rank_stderr_tails.items()},
    )
    launcher = run_dir / LAUNCHER_DIR / EVENTS_FILE
    if launcher.exists():  # the launched process only started the ranks: how it ended (torchrepro.runtime.follow)
        end = read_events(launcher).end
        meta["launcher"] = {
            "exit_code": result.exit_code,
            "status": end.status if end else "incomplete",
            "error": end.error if end else None,
        }
    if result.stopped_by:
        meta["stopped_by"] = result.stopped_by
    if result.not_started_within_s is not None:
        meta["not_started_within_s"] = result.not_started_within_s
    if result.stalled_after_s is not None:
        meta["stall"] = {
            "after_s": result.stalled_after_s,
            "stacks": {
                p.parent.name.split("-", 1)[1]: parse_stacks(p) for p in sorted(run_dir.glob("rank-*/stacks.txt"))
            },
        }
    write_json(run_dir / RUN_FILE, meta)
    return meta


def doctor_script(
    script: Path,
    args: list[str],
    *,
    run_dir: Path | None,
    budgets: Budgets,
    options: RunOptions,
    nproc: int = 1,
    timeout: float | None = None,
    resume: bool = False,
) -> tuple[DoctorReport, Path]:
    """Run ``script`` under capture as ``options`` say (one process, or ``nproc`` ranks via
    torchrun); analyse and write the report. ``timeout``: end the job after that many seconds
    without progress. ``resume`` (``doctor --fixes``): when ``run_dir`` holds this script's finished
    run, analyse that one instead of running it again."""
    script = validate_script(script)
    if resume and run_dir is not None and resumable(run_dir, script, args):
        claim_run_dir(run_dir, fresh=False)
        _say(f"{run_dir} holds this script's baseline run: going on with its fix runs")
        return analyse_run_dir(run_dir, budgets), run_dir
    return _baseline(script, args, run_dir, budgets, options, nproc, timeout, fresh=resume)


def _baseline(
    script: Path,
    args: list[str],
    run_dir: Path | None,
    budgets: Budgets,
    options: RunOptions,
    nproc: int,
    timeout: float | None,
    fresh: bool = False,
) -> tuple[DoctorReport, Path]:
    """The baseline run (``fresh``, as for ``doctor --fixes``: in a fresh copy of the working
    directory, as each fix run will be, :mod:`torchrepro.commands.workdir`)."""
    from ..workdir import fresh_workdir

    seed = options.seed
    run_dir = create_run_dir(run_dir or default_run_dir(script))
    meta = start_meta(script, args, seed=seed, world_size=nproc, **options.warm_start_meta)
    write_json(run_dir / RUN_FILE, meta)
    from ...render.live_text import live_status

    with (
        live_status(run_dir),  # a status line at the bottom of the terminal while the script runs
        fresh_workdir(run_dir, script, args, "baseline", enabled=fresh) as where,
    ):
        result = launch(
            run_dir, where.script, args, options, nproc=nproc, env=child_env(seed), stall_timeout=timeout, cwd=where.cwd
        )
    finish_meta(meta, result, run_dir)
    if timeout is not None and result.not_started_within_s is not None:
        raise NotStarted(timeout)  # said when it was ended: a rank that began its log as it was ended did not run
    if not any(run_dir.glob("rank-*/events.jsonl")):
        if result.stopped_by:
            raise Stopped(f"stopped by {result.stopped_by} before capture started", result.stopped_by)
        tail = "; ".join(result.stderr_tail[-3:])
        raise InputError(f"the script exited ({result.exit_code}) before capture started: {tail}")
    return analyse_run_dir(run_dir, budgets), run_dir


def doctor_from_trace(trace_dir: Path, run_dir: Path | None, budgets: Budgets) -> tuple[DoctorReport, Path]:
    """Build the doctor report from ``TORCH_TRACE`` logs written by a job without torchrepro."""
    from ...eventlog.structured_trace import trace_files, translate_file

    if not trace_dir.is_dir():
        raise InputError(f"no such trace directory: {trace_dir}")
    files = trace_files(trace_dir)
    if not files:
        raise InputError(f"{trace_dir} holds no TORCH_TRACE logs (*.log)")
    translated = [translate_file(file, rank=index) for index, file in enumerate(files)]
    if not any(kind not in ("other", "malformed") for _, t in translated for kind, n in t.counts.items() if n):
        lines = sum(sum(t.counts.values()) for _, t in translated)
        raise InputError(
            f"{trace_dir} holds no valid structured-trace record ({lines} record(s) read from "
            f"{len(files)} file(s), none that TORCH_TRACE writes)"
        )
    run_dir = create_run_dir(run_dir or default_run_dir(trace_dir.name, label="trace"))
    skipped: dict[str, int] = {}
    for file, (events, translator) in zip(files, translated):
        rank = translator.rank
        for event in events:
            event.rank = rank
        header = Header(rank=rank, argv=[str(file)], config={"source": "TORCH_TRACE"})
        counters = Counters(
            rank=rank,
            counters={
                "torchrepro": {
                    "unique_graphs_traced": translator.unique_graphs,
                    "malformed_records": translator.counts["malformed"],
                    "other_records": translator.counts["other"],
                }
            },
        )
        end = End(rank=rank, exit_code=None, status="imported")
        write_all(run_dir / f"rank-{rank}" / "events.jsonl", [header, *events, counters, end])
        skipped[str(file)] = translator.counts["other"] + translator.counts["malformed"]
    write_json(
        run_dir / RUN_FILE,
        {
            "source": "TORCH_TRACE",
            "trace_dir": str(trace_dir),
            "trace_files": [str(f) for f in files],
            "records_not_used": skipped,
        },
    )
    return analyse_run_dir(run_dir, budgets), run_dir
