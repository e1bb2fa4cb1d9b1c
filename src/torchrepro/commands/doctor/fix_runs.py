"""``doctor --fixes``: after the baseline run, re-run the script once per mechanical compile fix
(same seed and arguments, stopped :data:`~torchrepro.analysis.compile_fixes.WARM_STEPS` steps past
the baseline's last compile), each fix applied from outside the script (``torchrepro run --fix
SPEC``), then the recommended set together once; measure each run against the baseline.

Each run has its own directory, ``RUN_DIR/fixes/<name>``, and ``--jobs`` of them run side by side.
A finished run is kept (whatever its exit code): the same command on the same ``--out`` directory goes on where
an interrupted one stopped (:func:`~.job.resumable`). The decisions are pure
(:mod:`torchrepro.analysis.compile_fixes`); this module only launches and reads. The result is
also stored in ``RUN_DIR/fixes/compile_fixes.json``, which ``torchrepro report`` reads back.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from ...analysis.compile_fixes import (
    CompileFix,
    FixPlan,
    judge,
    listed,
    measure,
    numerics,
    plan_fixes,
    recommend,
    recommendable,
    window,
)
from ...errors import Stopped
from ...eventlog.event_reader import EventLog, rank_logs
from ...eventlog.rundir import RUN_FILE, load_run, write_json
from .job import FIXES_DIR, FIXES_FILE, _say, attach, finish_meta, start_meta
from ...reports.doctor_report import DoctorReport, TriedFix
from ...runtime.run_options import RunOptions
from ..launcher import child_env, launch, sharing_cores_env, stop_phase, stop_received
from ..workdir import fresh_workdir
from ...render.progress import Progress

COMBINED = "recommended_set"


class FixRunner:
    """Launches and reads back the fix runs of one ``doctor --fixes``."""

    def __init__(
        self,
        run_dir: Path,
        script: Path,
        args: list[str],
        options: RunOptions,
        *,
        nproc: int = 1,
        timeout: float | None = None,
    ):
        self.run_dir, self.script, self.args, self.nproc, self.timeout = run_dir, script, args, nproc, timeout
        self.options = replace(options, analysis_only=True)
        self.progress = Progress(Console(stderr=True))  # each fix run's step and time while it runs

    def run(self, name: str, spec: str, stop: int | None, env: dict[str, str] | None = None) -> list[EventLog] | None:
        """The event logs of the run of ``spec`` in ``fixes/<name>`` (a finished one with the same
        fix and stop is reused), or None when it did not end normally. ``env``: set in its
        environment, and said in its ``run.json``."""
        fix_dir = self.run_dir / FIXES_DIR / name
        try:
            meta = json.loads((fix_dir / RUN_FILE).read_text())
        except (OSError, ValueError):
            meta = None
        finished = isinstance(meta, dict) and "ended" in meta and not meta.get("stopped_by")
        if not (finished and meta.get("fix") == spec and meta.get("stop_after_step") == stop):
            if signal_name := stop_received():  # doctor is stopping: no run starts
                raise Stopped(f"fix {name}: not started, stopped by {signal_name}", signal_name)
            shutil.rmtree(fix_dir, ignore_errors=True)  # a run of ours cut short (or of another plan): again
            fix_dir.mkdir(parents=True)
            said: dict[str, Any] = {"env_set": env} if env else {}
            meta = start_meta(self.script, self.args, seed=self.options.seed, fix=spec, stop_after_step=stop, **said)
            write_json(fix_dir / RUN_FILE, meta)
            _say(f"fix {name}: {spec}" + (f", stopping after step {stop}" if stop is not None else ""))
            options = replace(self.options, run_dir=fix_dir, fix=spec, stop_after_step=stop)
            with (
                fresh_workdir(fix_dir, self.script, self.args, name, skip=[self.run_dir]) as where,
                self.progress.phase(f"fix {name}", fix_dir, None if stop is None else stop + 1),
            ):
                result = launch(
                    fix_dir,
                    where.script,
                    self.args,
                    options,
                    nproc=self.nproc,
                    quiet=True,
                    env=child_env(self.options.seed, env),
                    stall_timeout=self.timeout,
                    cwd=where.cwd,
                )
            meta = finish_meta(meta, result, fix_dir)  # (stopped: recorded as such, and run again next time)
            if result.stopped_by:  # a signal to torchrepro: doctor ends here (128 + N)
                raise Stopped(f"fix {name}: stopped by {result.stopped_by}; rerun to go on", result.stopped_by)
        if meta.get("exit_code") != 0 or not rank_logs(fix_dir):
            return None
        return load_run(fix_dir).logs


def try_fixes(
    report: DoctorReport,
    runner: FixRunner,
    *,
    only: list[str] | None = None,
    jobs: int = 1,
) -> None:
    """Plan, run and judge the compile fixes of ``report`` (the baseline in ``runner.run_dir``);
    store the result beside the runs and in ``report``."""
    plan: FixPlan = plan_fixes(report.compile)
    tried = [c for c in plan.candidates if not only or c.name in only]
    rows: list[TriedFix] = []
    combined: TriedFix | None = None
    if report.run.failed or report.run.meta.get("stopped_by"):
        note = "the baseline run did not end normally: no fix was run"
    elif not tried:
        note = (
            "no recompile or graph break with a mechanical fix: no fix was run"
            if not plan.candidates
            else f"--only-fixes left none of {', '.join(c.name for c in plan.candidates)} to try: no fix was run"
        )
    else:
        baseline = load_run(runner.run_dir).logs
        stop = window(baseline)
        before = measure(baseline, stop)

        beside = sharing_cores_env() if jobs > 1 and len(tried) > 1 else None  # runs side by side
        done: dict[str, TriedFix] = {}  # the fixes judged so far, by name

        def attempt(fix: CompileFix) -> TriedFix:
            logs = runner.run(fix.name, fix.spec, stop, beside)
            row = judge(fix, before, measure(logs, stop) if logs else None, numerics(baseline, logs) if logs else None)
            done[fix.name] = row
            return row

        try:
            with stop_phase("doctor --fixes"):  # a stop signal: every fix run stops, what finished is kept
                with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                    rows = list(pool.map(attempt, tried))
                good = recommendable(rows)
                if len(good) > 1:
                    together = CompileFix(
                        COMBINED,
                        "+".join(r["spec"] for r in good),
                        " + ".join(r["name"] for r in good),
                        "; ".join(r["line"] for r in good),
                        sum(r["expected_removed"] for r in good),
                    )
                    combined = attempt(together)
        except Stopped as stopped:
            rows = [done[fix.name] for fix in tried if fix.name in done]
            note = (
                f"partial: stopped by {stopped.signal_name} after {len(rows)} of {len(tried)} fix(es); "
                "the same command on the same --out goes on where it stopped"
            )
            _store(report, runner, plan, rows, done.get(COMBINED), note, partial=True)
            raise Stopped(
                f"doctor --fixes: stopped by {stopped.signal_name} after {len(rows)} of {len(tried)} fix run(s); "
                f"what finished is in {runner.run_dir / FIXES_DIR / FIXES_FILE}: the same command goes on",
                stopped.signal_name,
            ) from None
        runs = len(tried) + (combined is not None)
        window_text = f"stopped after step {stop}" if stop is not None else "whole runs"
        note = f"{len(tried)} fix(es) tried in {runs} run(s) ({window_text}), each against the baseline"
    _store(report, runner, plan, rows, combined, note)


def _store(
    report: DoctorReport,
    runner: FixRunner,
    plan: FixPlan,
    rows: list[TriedFix],
    combined: TriedFix | None,
    note: str,
    partial: bool = False,
) -> None:
    """The fixes tried (``partial``: the fix runs were stopped, these are the ones that finished),
    into ``fixes/compile_fixes.json`` and, read back as ``torchrepro report`` reads it, into ``report``."""
    (runner.run_dir / FIXES_DIR).mkdir(exist_ok=True)
    write_json(
        runner.run_dir / FIXES_DIR / FIXES_FILE,
        {
            "compile_fixes": [*rows, *listed(plan)],
            "compile_fix_recommended": None if partial else recommend(rows, combined),
            "compile_fix_note": note,
            **({"partial": True} if partial else {}),
        },
    )
    attach(report, runner.run_dir)


def try_fixes_stored(report: DoctorReport, runner: FixRunner, *, only: list[str] | None, jobs: int) -> None:
    """``doctor --fixes``: :func:`try_fixes`, then the report written again with their result (also
    when a signal stops them: the report says which fixes finished, marked partial)."""
    from ...render.save import write_report

    try:
        try_fixes(report, runner, only=only, jobs=jobs)
    except Stopped:
        write_report(runner.run_dir, report)
        raise
    write_report(runner.run_dir, report)
