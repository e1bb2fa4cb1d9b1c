"""``torchrepro drift``: run a script many times with its sources of variation set apart — a seed per
stream (init, data order, augmentation) and switches (compile, backend, threads ...) — in parallel
and resumably, then say which factor moves the metric (statistics: :mod:`torchrepro.analysis.drift`).

The design: the random factors are fully crossed (``--runs N`` levels each: N² runs for init ×
order); every binary factor is run one at a time against the script as written on the *same*
seeds, so each of its levels is compared in pairs. With no random factor the N levels vary every
stream at once. What a run does with its levels: :mod:`torchrepro.runtime.factors`.

``--out`` holds ``plan.json`` (the run matrix), ``runs/<key>/`` (one ``torchrepro run`` per cell;
``key`` hashes the script's content, its arguments, the root seed and the cell's levels, so a run
is reused only for the same configuration), ``runs/<key>/drift-run.json`` (written when that run
ended: it is finished), ``report.json``, ``report.html`` and one ``plot-<factor>.svg`` per factor.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from ...analysis.drift import BINARY_FACTORS, RANDOM_FACTORS, DriftRun, fmt_number, analyse, verdict
from ...analysis.sequential import plan_sentence, planning, sequential_section, sequential_verdict
from ...errors import InputError, Stopped, UserError
from ...eventlog.event_reader import read_events, read_header
from ...eventlog.events import EVENTS_FILE, Event, Metric, Step
from ..workdir import fresh_workdir
from ...render.progress import Progress as Lines
from ..launcher import (
    STDERR_TAIL_LINES,
    Job,
    child_env,
    end_jobs,
    run_command,
    sharing_cores_env,
    spawn,
    stop_received,
    wait_stoppable,
)
from ...telemetry.otlp import launch_span
from ...runtime.run_options import RunOptions
from ...reports.drift_report import DriftAnalysis, DriftReport, DriftSection, DriftSettings, FactorPlan
from ...render.sanitize import visible
from ...eventlog.rundir import LOCK_FILE, check_fields, read_json_file, write_json
from ...render.save import write_report

if TYPE_CHECKING:
    from rich.console import Console

ALL_SEEDS = "seeds"  # the one random axis when no random factor is named: every stream varied at once
PLAN_FILE = "plan.json"
PLAN_SCHEMA = "torchrepro.drift-plan/1"
RECORD_FILE = "drift-run.json"
ATTEMPT_FILE = "attempt.json"  # which attempt at the cell this run dir holds, and the process running it


@dataclass
class MetricSpec:
    """Where a run's metric comes from: a ``log_metric`` name, a regex over stdout, or the final loss."""

    name: str | None = None
    regex: str | None = None

    def __post_init__(self) -> None:
        if self.regex is not None:
            try:
                groups = re.compile(self.regex).groups
            except re.error as exc:
                raise UserError(f"--metric-regex {self.regex!r} is not a regular expression: {exc}") from None
            if groups != 1:
                raise UserError(f"--metric-regex needs exactly one group (...) around the number, found {groups}")

    def describe(self) -> str:
        if self.name:
            return f"the last value logged with torchrepro.log_metric({self.name!r})"
        if self.regex:
            return f"group 1 of the last stdout line matching {self.regex!r}"
        return "the final training loss (the last step's loss)"

    def label(self) -> str:
        return self.name or ("metric" if self.regex else "final loss")


class MetricJson(TypedDict):
    """``plan.json``'s ``metric``: a :class:`MetricSpec`."""

    name: str | None
    regex: str | None


class _CellFields(TypedDict):
    index: int
    key: str
    seeds: dict[str, int]
    settings: dict[str, str]


class CellJson(_CellFields):
    """One of ``plan.json``'s ``cells``: a :class:`Cell` and its run folder."""

    dir: str


class SequentialPlan(TypedDict):
    """``plan.json``'s ``sequential`` (``--until-clear``): the levels per factor at each look so far,
    the budget of runs and the target effect."""

    looks: list[int]
    max_runs: int
    target_effect: float | None


class _PlanFields(TypedDict):
    schema: str
    script: str
    script_sha256: str
    args: list[str]
    seed: int
    vary: list[str]
    random: list[str]
    binary: list[str]
    runs: int
    metric: MetricJson
    cells: list[CellJson]


class Plan(_PlanFields, total=False):
    """``plan.json``: the run matrix (:func:`make_plan`), ``sequential`` only under ``--until-clear``,
    ``module`` only for ``-m MODULE`` (``script`` is then its file)."""

    sequential: SequentialPlan
    module: str


Levels = dict[str, int | str]  # a run's factor levels (torchrepro.runtime.factors): seeds, threads, backend ...


class RunRecord(_CellFields):
    """``drift-run.json``: a cell's run that finished (written when it ended)."""

    levels: Levels
    compile_mode: str | None
    exit_code: int
    attempts: int  # records written before attempts were counted lack it: read with .get("attempts", 1)
    wall_s: float
    stderr_tail: list[str]


@dataclass
class Cell:
    """One run of the matrix: its seed levels and settings (``{}``: the script as written)."""

    index: int
    key: str
    seeds: dict[str, int]
    settings: dict[str, str]

    @property
    def dir(self) -> str:
        return f"runs/{self.key}"

    def to_json(self) -> CellJson:
        return {
            "index": self.index,
            "key": self.key,
            "seeds": dict(self.seeds),
            "settings": dict(self.settings),
            "dir": self.dir,
        }


def _key(script_sha: str, args: list[str], root: int, seeds: dict[str, int], settings: dict[str, str]) -> str:
    text = json.dumps(
        {"script": script_sha, "args": args, "root": root, "seeds": seeds, "settings": settings}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_plan(
    script: Path,
    args: list[str],
    factors: list[str],
    runs: int,
    seed: int,
    metric: MetricSpec,
    max_runs: int | None = None,
    sequential: SequentialPlan | None = None,
    module: str | None = None,
) -> Plan:
    """The run matrix (see the module docstring) as JSON: everything ``--run-one`` and ``--collect`` need.
    ``factors``: known names, each once (:func:`torchrepro.commands.options.factors`). A design of more
    than ``max_runs`` runs is a :class:`UserError`, raised before the matrix is built. ``sequential``
    (``--until-clear``): its looks (levels per factor at each), budget and target effect. ``module``:
    each run runs it as ``python -m`` does (``script`` is its file)."""
    random = [n for n in factors if n in RANDOM_FACTORS]
    binary = [n for n in factors if n in BINARY_FACTORS]
    axes = random or [ALL_SEEDS]
    settings_list: list[dict[str, str]] = [{}]
    for name in binary:
        settings_list += [s for s in BINARY_FACTORS[name].settings if s not in settings_list]
    size = len(settings_list) * runs ** len(axes)
    if max_runs is not None and size > max_runs:
        raise UserError(
            f"--runs {runs} --vary {','.join(factors)} plans {size:,} runs, more than {max_runs:,}: "
            "give fewer --runs or factors, or --allow-large to run it anyway"
        )
    script_sha = hashlib.sha256(script.read_bytes()).hexdigest()
    cells: list[Cell] = []
    for settings in settings_list:
        for levels in itertools.product(range(runs), repeat=len(axes)):
            seeds = dict(zip(axes, levels))
            cells.append(Cell(len(cells), _key(script_sha, args, seed, seeds, settings), seeds, settings))
    plan: Plan = {
        "schema": PLAN_SCHEMA,
        "script": str(script.resolve()),
        "script_sha256": script_sha,
        "args": list(args),
        "seed": seed,
        "vary": [*random, *binary],
        "random": random,
        "binary": binary,
        "runs": runs,
        "metric": {"name": metric.name, "regex": metric.regex},
        "cells": [c.to_json() for c in cells],
    }
    if sequential:
        plan["sequential"] = sequential
    if module:
        plan["module"] = module
    return plan


def cells_of(plan: Plan) -> list[Cell]:
    """The plan's cells; a key that is not 16 hex digits (a run folder name) is an input error."""
    try:
        cells = [Cell(int(c["index"]), str(c["key"]), dict(c["seeds"]), dict(c["settings"])) for c in plan["cells"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{PLAN_FILE}: malformed cell ({exc})") from None
    if any(not re.fullmatch(r"[0-9a-f]{16}", c.key) for c in cells):
        raise InputError(f"{PLAN_FILE}: a cell key is not 16 hex digits")
    return cells


def child_levels(plan: Plan, cell: Cell) -> tuple[str | None, Levels]:
    """The ``--compile-mode`` and the factor levels (:mod:`torchrepro.runtime.factors`) of one run. Random
    factors not varied stay at level 0: their streams are still separate."""
    if ALL_SEEDS in cell.seeds:
        streams = {name: cell.seeds[ALL_SEEDS] for name in RANDOM_FACTORS}
    else:
        streams = {name: cell.seeds.get(name, 0) for name in RANDOM_FACTORS}
    levels: Levels = {"root": plan["seed"], **streams}
    compile_mode = None
    for name, value in cell.settings.items():
        if name == "compile":
            compile_mode = "eager"
        elif name == "fallback-random":
            compile_mode = "fallback-random"
        elif name == "threads":
            levels["threads"] = int(value)
        elif name == "deterministic":
            levels["deterministic"] = True
        elif name == "backend":
            levels["backend"] = value
    return compile_mode, levels


def load_plan(run_dir: Path) -> Plan:
    """``run_dir``'s ``plan.json``; an :class:`InputError` when it is missing, unreadable, of another
    schema or a field holds another JSON type (its cells are checked by :func:`cells_of`)."""
    path = run_dir / PLAN_FILE
    if not path.is_file():
        raise InputError(
            f"{run_dir} holds no {PLAN_FILE}: not a drift directory (make one with torchrepro drift --plan)"
        )
    try:
        data = read_json_file(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
        raise InputError(f"{path}: not a {PLAN_SCHEMA} file")
    check_fields(path, data, PLAN_FIELDS)
    return cast(Plan, data)  # the JSON types of its fields checked just above


# plan.json's fields (make_plan) and the JSON types each may hold
PLAN_FIELDS: dict[str, tuple[type, ...]] = {
    **dict.fromkeys(("script", "schema", "module"), (str,)),
    **dict.fromkeys(("args", "vary", "random", "binary", "cells"), (list,)),
    **dict.fromkeys(("seed", "runs"), (int,)),
    **dict.fromkeys(("metric", "sequential"), (dict,)),
}


def plan_size(plan: Plan, levels: int) -> int:
    """The runs of ``plan``'s design at ``levels`` levels per seed axis (the settings × levels^axes)."""
    axes = len(plan["random"]) or 1
    return int(len(plan["cells"]) // plan["runs"] ** axes * levels**axes)  # int ** int is typed Any (2 ** -1 is float)


def check_run_dir(run_dir: Path, plan: Plan) -> None:
    """:class:`InputError` unless ``run_dir`` is a new or empty directory, or one holding a drift
    experiment of the same script (its finished runs are reused). Anything else is never touched."""
    if run_dir.exists() and (not run_dir.is_dir() or any(p.name != LOCK_FILE for p in run_dir.iterdir())):
        old = load_plan(run_dir) if (run_dir / PLAN_FILE).exists() else None
        if old is None:
            raise InputError(f"{run_dir} exists and is not a drift directory: choose another --out")
        if old.get("script") != plan["script"]:
            raise InputError(f"{run_dir} holds a drift experiment of {old.get('script')}: choose another --out")


def prepare_run_dir(run_dir: Path, plan: Plan) -> None:
    """Write the plan into ``run_dir`` (:func:`check_run_dir` first)."""
    check_run_dir(run_dir, plan)
    write_json(run_dir / PLAN_FILE, plan)


def read_record(run_dir: Path, cell: Cell) -> RunRecord | None:
    """The record of a finished run (None: not run, or interrupted)."""
    try:
        record = json.loads((run_dir / cell.dir / RECORD_FILE).read_text())
    except (OSError, ValueError):
        return None
    # the record drift wrote for this cell (its key): read as written
    return cast(RunRecord, record) if isinstance(record, dict) and record.get("key") == cell.key else None


class Runner:
    """Runs cells as ``torchrepro run`` jobs (:func:`~torchrepro.commands.launcher.spawn`, output to
    the run's logs); :meth:`stop` ends every live one. ``env``: set in each run's environment
    (:func:`~torchrepro.commands.launcher.sharing_cores_env` when runs go side by side)."""

    def __init__(self, run_dir: Path, plan: Plan, env: dict[str, str] | None = None):
        self.run_dir, self.plan, self.env = run_dir, plan, env or {}
        self.script = Path(plan["script"])
        self._live: dict[int, Job] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self, cell: Cell) -> RunRecord | None:
        """Run one cell; its record, or None when stopped before it finished."""
        run_dir = self.run_dir / cell.dir
        attempt = 1
        if run_dir.exists():  # an attempt that never finished (drift was interrupted, its worker died)
            try:
                previous = read_json_file(run_dir / ATTEMPT_FILE)
            except (OSError, ValueError):
                previous = None  # killed before it was written
            attempt = (previous.get("attempt", 1) if isinstance(previous, dict) else 1) + 1
            shutil.rmtree(run_dir)
        logs = run_dir / "logs"
        logs.mkdir(parents=True)
        # pid: the process running it; env_set: what torchrepro set in the run's environment
        write_json(
            run_dir / ATTEMPT_FILE,
            {"attempt": attempt, "pid": os.getpid(), **({"env_set": self.env} if self.env else {})},
        )
        compile_mode, levels = child_levels(self.plan, cell)
        options = RunOptions(
            run_dir=run_dir.resolve(),
            compile_mode=compile_mode,
            factors=levels,
            analysis_only=True,
            module=self.plan.get("module"),
        )
        env = child_env(self.plan["seed"], options.env() | self.env)
        t0 = time.perf_counter()
        with (
            # each run in a fresh copy of the working directory (commands.workdir)
            fresh_workdir(run_dir, self.script, self.plan["args"], cell.dir, skip=[self.run_dir]) as where,
            launch_span(run_dir, 1) as trace,  # --otlp-endpoint: a span per run, its context to the child
            open(logs / "stdout.log", "wb") as out_log,
            open(logs / "stderr.log", "wb") as err_log,
        ):
            with self._lock:
                if self.stopping.is_set() or stop_received():  # drift is stopping: no run starts
                    return None
                cmd = run_command(where.script, self.plan["args"])
                job = spawn(
                    cmd,
                    stdout=out_log,
                    stderr=err_log,
                    stdin=subprocess.DEVNULL,
                    env=trace.child_env(env),
                    cwd=where.cwd,
                )
                self._live[job.pgid] = job
            try:
                code, stopped_by = wait_stoppable(job)  # a stop signal to torchrepro: forwarded to the run
                trace.exit_code = code
            except BaseException:  # a cancelled Ray task
                self.stop()
                raise
            finally:
                with self._lock:
                    self._live.pop(job.pgid, None)
            end_jobs([job])  # what the script left running
        if stopped_by:  # no record: the run goes again next time
            raise Stopped(f"run {cell.index}: stopped by {stopped_by}", stopped_by)
        if self.stopping.is_set():
            return None
        tail = (logs / "stderr.log").read_text(errors="replace").splitlines()[-STDERR_TAIL_LINES:]
        record: RunRecord = {
            "key": cell.key,
            "index": cell.index,
            "seeds": cell.seeds,
            "settings": cell.settings,
            "levels": levels,
            "compile_mode": compile_mode,
            "exit_code": code,
            "attempts": attempt,
            "wall_s": round(time.perf_counter() - t0, 3),
            "stderr_tail": tail,
        }
        write_json(run_dir / RECORD_FILE, record)
        return record

    def stop(self) -> None:
        """End every live run (:func:`~torchrepro.commands.launcher.end_jobs`)."""
        self.stopping.set()
        with self._lock:
            live = list(self._live.values())
        end_jobs(live)


def unfinished(run_dir: Path, cell: Cell) -> bool:
    """Whether ``cell`` is still to run: it has no record, or its process died without writing its
    end event (killed: by the OOM killer, ``kill -9``, a torchrepro that was itself killed), which
    says nothing about the script."""
    record = read_record(run_dir, cell)
    if record is None:
        return True
    if not record.get("exit_code"):
        return False
    log = run_dir / cell.dir / "rank-0" / EVENTS_FILE
    return not log.is_file() or read_events(log).end is None


def run_all(run_dir: Path, plan: Plan, jobs: int, console: Console, launcher: str = "local") -> dict[str, int]:
    """Run every cell without a record, ``jobs`` at a time (``launcher="ray"``: as Ray tasks), with a
    live progress bar (ETA) on ``console``. Returns counts ``{"planned", "reused", "ran", "crashed"}``;
    on Ctrl-C or SIGTERM the live runs are ended (they rerun next time) and KeyboardInterrupt propagates,
    as :class:`UserError` does when the first run that ends normally lacks the ``--metric``
    (:func:`check_metric`)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    cells = cells_of(plan)
    metric = MetricSpec(**plan["metric"])
    checked = False
    pending = [c for c in cells if unfinished(run_dir, c)]
    counts = {"planned": len(cells), "reused": len(cells) - len(pending), "ran": 0, "crashed": 0}
    if not pending:
        return counts
    columns = (
        TextColumn("drift"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("runs ·"),
        TimeElapsedColumn(),
        TextColumn("· ETA"),
        TimeRemainingColumn(),
    )
    # not a terminal (a log), where the bar is not drawn: a line every LOG_EVERY_S seconds instead
    in_log = Lines(None if console.is_terminal else console)
    with (
        Progress(*columns, console=console, transient=False) as progress,
        in_log.phase("drift", note=lambda: f"{counts['ran']} of {len(pending)} runs done"),
    ):
        task = progress.add_task("drift", total=len(pending))
        finished = (
            _on_ray(run_dir, plan, pending, jobs) if launcher == "ray" else _locally(run_dir, plan, pending, jobs)
        )
        with contextlib.closing(finished):  # an interrupt anywhere here ends the live runs at once
            for record in finished:
                counts["ran"] += 1
                if record["exit_code"]:
                    counts["crashed"] += 1
                    last = record["stderr_tail"][-1] if record["stderr_tail"] else ""
                    progress.console.print(
                        f"run {record['index']} exited with {record['exit_code']}: {visible(last)[:160]}",
                        markup=False,
                        highlight=False,
                    )
                elif not checked:
                    checked = True
                    check_metric(run_dir, record, metric)
                progress.advance(task)
    return counts


def _locally(run_dir: Path, plan: Plan, cells: list[Cell], jobs: int) -> Generator[RunRecord, None, None]:
    """The records of ``cells`` as they finish, ``jobs`` child processes at a time."""
    runner = Runner(run_dir, plan, sharing_cores_env() if jobs > 1 else None)
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for future in as_completed([pool.submit(runner.run, cell) for cell in cells]):
            record = future.result()
            if record is not None:
                yield record
    except BaseException:
        runner.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _on_ray(run_dir: Path, plan: Plan, cells: list[Cell], jobs: int) -> Generator[RunRecord, None, None]:
    """The records of ``cells`` run as Ray tasks (1 CPU each) on ``$RAY_ADDRESS``'s cluster, else on a
    local one with ``jobs`` CPUs. ``--out`` (absolute here) must be on a filesystem every node sees."""
    try:
        import ray
    except ImportError:
        raise UserError("--launcher ray needs Ray: pip install 'torchrepro[ray]'") from None
    started = not ray.is_initialized()
    if started:
        address = os.environ.get("RAY_ADDRESS", "").strip()
        _ray_reachable(address)
        try:  # a new local cluster (no RAY_ADDRESS): jobs CPUs, no dashboard
            ray.init(
                log_to_driver=False, num_cpus=None if address else jobs, include_dashboard=None if address else False
            )
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise UserError(
                f"--launcher ray: cannot join the Ray cluster at {address or 'a new local one'}: {exc}"
            ) from None
    run_cell = ray.remote(num_cpus=1)(_run_cell)  # a worker that dies: Ray runs the task again (attempts)
    index = {run_cell.remote(str(run_dir.resolve()), plan, cell): cell.index for cell in cells}
    waiting = list(index)
    try:
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1, timeout=0.5)
            if signal_name := stop_received():  # the tasks are cancelled below: their runs rerun next time
                raise Stopped(f"stopped by {signal_name}", signal_name)
            if not done:
                continue
            try:
                record = ray.get(done[0])
            except ray.exceptions.RayError as exc:  # its retries spent too
                raise UserError(
                    f"--launcher ray: run {index[done[0]]} failed in Ray ({type(exc).__name__}); finished runs are "
                    f"kept in {run_dir}: run the same command again"
                ) from None
            if record is not None:
                yield record
    except BaseException:
        for ref in waiting:
            ray.cancel(ref)  # KeyboardInterrupt in the task: its Runner ends the run
        raise
    finally:
        if started:
            ray.shutdown()


def _ray_reachable(address: str, timeout_s: float = 3.0) -> None:
    """A ``RAY_ADDRESS`` (``host:port``, ``ray://host:port``) whose port does not answer is one line,
    in seconds: Ray itself retries for minutes and ends in a traceback. ``auto``/``local``/unset: Ray's."""
    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    default = 10001 if address.startswith("ray://") else 6379
    try:
        socket.create_connection((host.strip("[]") or hostport, int(port) if host else default), timeout_s).close()
    except (OSError, ValueError) as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else getattr(exc, "strerror", None) or str(exc)
        raise UserError(
            f"--launcher ray: the Ray cluster at RAY_ADDRESS={visible(address)} is unreachable ({reason})"
        ) from None


def _run_cell(run_dir: str, plan: Plan, cell: Cell) -> RunRecord | None:
    """One cell in a Ray worker."""
    return Runner(Path(run_dir), plan).run(cell)


def _metric(spec: MetricSpec, events: list[Event], stdout: Path) -> tuple[float | None, str | None]:
    if spec.name:
        values = [e.value for e in events if isinstance(e, Metric) and e.name == spec.name and e.value is not None]
        return (values[-1], None) if values else (None, f"no torchrepro.log_metric({spec.name!r}) in the run")
    if spec.regex:
        try:
            text = stdout.read_text(errors="replace")
        except OSError:
            text = ""
        matches = list(re.finditer(spec.regex, text, re.MULTILINE))
        if not matches:
            return None, f"no stdout line matched {spec.regex!r}"
        try:
            return float(matches[-1].group(1)), None
        except ValueError:
            return None, f"the last match {matches[-1].group(1)[:40]!r} is not a number"
    losses = [s.loss for s in events if isinstance(s, Step) and s.loss is not None]
    return (losses[-1], None) if losses else (None, "no training step recorded a loss")


def check_metric(run_dir: Path, record: RunRecord, metric: MetricSpec) -> None:
    """``--metric NAME``: a :class:`UserError` naming the metrics a finished run did log when it
    logged no ``NAME`` (checked on the first run, so a misspelt name does not cost the whole design)."""
    if not metric.name:
        return
    log = run_dir / "runs" / record["key"] / "rank-0" / EVENTS_FILE
    names = {e.name for e in read_events(log).events if isinstance(e, Metric)} if log.is_file() else set()
    if metric.name not in names:
        logged = ", ".join(repr(n) for n in sorted(names)) or "none"
        raise UserError(
            f"--metric {visible(repr(metric.name))}: run {record['index']} logged no such metric (it logged: "
            f"{visible(logged)}); stopped after it, finished runs are kept in {run_dir}"
        )


def collect(run_dir: Path, plan: Plan, metric: MetricSpec) -> list[DriftRun]:
    """Every cell as a :class:`DriftRun`: its metric and what capture observed, or why it is excluded."""
    runs = []
    for cell in cells_of(plan):
        record = read_record(run_dir, cell)
        run = DriftRun(cell.index, cell.seeds, cell.settings, None, "missing", dir=str(run_dir / cell.dir))
        runs.append(run)
        if record is None:
            run.error = "not run (or interrupted)"
            continue
        log = run_dir / cell.dir / "rank-0" / EVENTS_FILE
        events = read_events(log).events if log.is_file() else []
        steps = [e for e in events if isinstance(e, Step)]
        if steps:
            run.rng0 = (steps[0].rng_fps or {}).get("torch_cpu")
            if any(s.batch_fp for s in steps):
                run.batches = tuple(s.batch_fp or "" for s in steps)
        run.extra["wall_s"] = record.get("wall_s")
        run.extra["attempts"] = record.get("attempts", 1)
        if record.get("exit_code"):
            tail = record.get("stderr_tail") or []
            run.status = "crashed"
            run.error = f"exit {record['exit_code']}" + (f": {visible(tail[-1])[:300]}" if tail else "")
            continue
        run.metric, problem = _metric(metric, events, run_dir / cell.dir / "logs" / "stdout.log")
        if run.metric is not None and not math.isfinite(run.metric):
            run.metric, problem = None, f"the metric is {run.metric}"
        run.status, run.error = ("ok", None) if problem is None else ("no_metric", problem)
    return runs


def build_report(
    run_dir: Path,
    plan: Plan,
    runs: list[DriftRun],
    metric: MetricSpec,
    *,
    observed: float | None,
    target_effect: float | None,
    counts: dict[str, int] | None = None,
    wall_s: float | None = None,
    partial: str | None = None,
) -> DriftReport:
    """Analyse the runs and write ``report.json`` (schema torchrepro.drift/1), ``report.html`` and the
    plots. Its ``exit_code``: 3 when a run crashed, 1 when a binary factor makes a real difference.
    ``partial``: why the runs were cut short (said first among the notes)."""
    from ...eventlog.provenance import launch_meta, provenance
    from ...render.svg import write_drift_plots

    random = plan["random"]
    binary = [BINARY_FACTORS[name] for name in plan["binary"]]
    section = analyse(runs, random, binary, plan["runs"], observed=observed, target_effect=target_effect)
    add_plan_and_path(section, plan, runs, target_effect=target_effect, observed=observed)
    if partial is not None:
        done = sum(r.status != "missing" for r in runs)
        section["notes"].insert(
            0, f"partial: {partial} after {done} of {len(runs)} runs; the same command again runs the others"
        )
    rerun = [r for r in runs if r.extra.get("attempts", 1) > 1]
    if rerun:
        section["notes"].append(
            "run again from the start, counted once (an earlier attempt ended without finishing: drift was "
            "interrupted, or the process or Ray worker running it died): "
            + ", ".join(f"run {r.index} ({r.extra['attempts']} attempts)" for r in rerun)
        )
    drift = DriftSection.from_json(
        {
            "metric": {
                "name": metric.label(),
                "source": metric.describe(),
                "log_metric": metric.name,
                "regex": metric.regex,
            },
            "design": _design(plan),
            "runs": [
                {
                    "index": r.index,
                    "levels": {**r.seeds, **r.settings},
                    "seed": {"root": plan["seed"], **r.seeds},
                    "metric": r.metric,
                    "status": r.status,
                    "error": r.error,
                    "dir": r.dir,
                    "wall_s": r.extra.get("wall_s"),
                    "attempts": r.extra.get("attempts", 1),
                }
                for r in runs
            ],
            **section,
        }
    )
    drift.plots = write_drift_plots(run_dir, drift)
    logs = (Path(r.dir) / "rank-0" / EVENTS_FILE for r in runs)
    header = next((h for log in logs if log.is_file() and (h := read_header(log)) is not None), None)
    report = DriftReport(
        run=DriftSettings(
            script=plan["script"],
            args=plan["args"],
            out=str(run_dir),
            seed=plan["seed"],
            vary=plan["vary"],
            levels_per_factor=plan["runs"],
            compile_cache=os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "torch's default (one per user)",
            wall_s=wall_s,
            counts=counts or {},
        ),
        drift=drift,
        provenance=provenance(
            {**launch_meta(Path(plan["script"])), "script": plan["script"], "args": plan["args"]}, header
        ),
    )
    write_report(run_dir, report)
    return report


def sequential_stop(run_dir: Path, plan: Plan, metric: MetricSpec, target_effect: float | None) -> str:
    """Whether ``--until-clear`` goes on after this look: ``continue``, else why it stops
    (:func:`torchrepro.analysis.sequential.sequential_section`)."""
    runs = collect(run_dir, plan, metric)
    section = analyse(runs, plan["random"], [BINARY_FACTORS[b] for b in plan["binary"]], plan["runs"])
    add_plan_and_path(section, plan, runs, target_effect=target_effect, observed=None)
    return str(section["sequential"]["stop"])


def pilot_planning(
    run_dir: Path,
    plan: Plan,
    metric: MetricSpec,
    target_effect: float | None,
    observed: float | None,
    jobs: int,
) -> list[FactorPlan] | None:
    """``--plan`` on a directory with finished runs (a pilot): the runs each factor needs
    (:func:`torchrepro.analysis.sequential.planning`, sequential batches of ``jobs`` runs); None
    without a finished run."""
    if not (run_dir / PLAN_FILE).is_file():
        return None
    runs = collect(run_dir, plan, metric)
    if not any(r.status == "ok" for r in runs):
        return None
    random, binary = plan["random"], [BINARY_FACTORS[b] for b in plan["binary"]]
    section = analyse(runs, random, binary, plan["runs"], observed=observed, target_effect=target_effect)
    per_level = plan_size(plan, 1)  # runs per seed cell: one per setting
    return planning(
        section,
        runs,
        random,
        binary,
        lambda n: plan_size(plan, n),
        step=max(1, jobs // per_level),
        target_effect=target_effect,
        observed=observed,
    )


def add_plan_and_path(
    section: DriftAnalysis,
    plan: Plan,
    runs: list[DriftRun],
    *,
    target_effect: float | None,
    observed: float | None,
) -> None:
    """Add ``planning`` (runs needed per factor) and, for an ``--until-clear`` experiment,
    ``sequential`` (each factor's path and decision) to an analysed section, and say both in its
    verdict (:mod:`torchrepro.analysis.sequential`)."""
    random = plan["random"]
    binary = [BINARY_FACTORS[name] for name in plan["binary"]]
    seq_plan = plan.get("sequential")
    looks = seq_plan["looks"] if seq_plan else []

    def runs_at(levels: int) -> int:
        return plan_size(plan, levels)

    batch = 1
    if len(looks) > 1:  # pairs added per batch, as the sequential run adds them
        axes = len(random) or 1
        batch = max(1, looks[-1] ** axes - looks[-2] ** axes)
    section["planning"] = planning(
        section, runs, random, binary, runs_at, step=batch, target_effect=target_effect, observed=observed
    )
    if seq_plan:
        blocked = frozenset(f for item in section["not_separable"] for f in item["factors"])
        seq = sequential_section(
            runs,
            random,
            binary,
            looks,
            runs_at,
            max_runs=seq_plan["max_runs"],
            target_effect=seq_plan.get("target_effect"),
            blocked=blocked,
        )
        section["sequential"] = seq
        real = {f["factor"] for f in seq["factors"] if f["decision"] not in ("undecided", "out_of_reach")}
        head = [sequential_verdict(seq, fmt_number)]
        rest = verdict([], section["factors"], section["not_separable"], section["observed"])
        if section["factors"] or section["not_separable"] or section["observed"]:
            head.append(rest)  # shares, what could not be separated, the observed difference
    else:
        real = {e["factor"] for e in section["effects"] if e["p_value"] is not None and e["p_value"] < e["alpha"]}
        head = [section["verdict"]]
    more = [
        plan_sentence(p, fmt_number) for p in section["planning"] if p["kind"] == "binary" and p["factor"] not in real
    ]
    section["verdict"] = "; ".join([*head, *more])


def _design(plan: Plan) -> str:
    n, random, binary = plan["runs"], plan["random"], plan["binary"]
    text = (
        (" × ".join(f"{name} ({n} seeds)" for name in random) + ", fully crossed")
        if random
        else f"{n} seed levels varying init, order and augment at once"
    )
    if binary:
        text += "; " + ", ".join(binary) + " each run on the same seeds as the script as written (paired)"
    return text + f"; {len(plan['cells'])} runs"
