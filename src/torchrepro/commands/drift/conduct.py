"""How a ``torchrepro drift`` experiment is carried out: :class:`DriftRequest`, what it is asked
(built by :func:`torchrepro.drift`), and :func:`experiment`: plan the run matrix, run what it still
lacks (``--until-clear``: a batch of seed levels at a time until each factor is decided), collect
the runs and report; a stop signal ends the live runs and writes a partial report."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import Stopped, UserError
from ..options import over_process_limit
from ...eventlog.rundir import REPORT_FILE

if TYPE_CHECKING:
    from rich.console import Console

    from ...reports.drift_report import DriftReport
    from .experiment import MetricSpec, Plan, SequentialPlan

MAX_RUNS = 10_000  # the largest design (cells x runs) run without --allow-large
DEFAULT_BUDGET = 200  # drift --until-clear's --max-runs


@dataclass(frozen=True)
class DriftRequest:
    """What ``torchrepro drift`` is asked, typed once (:func:`torchrepro.drift` builds it): the
    experiment on ``script`` with ``args`` (``vary``: its factors, default init,order,compile;
    ``runs``: seeds per random factor, default 4; ``seed``: the root of the seed tree) in ``out``
    (None: a new directory under ``torchrepro-runs/``), ``jobs`` runs at a time through ``launcher``;
    the metric (``metric``: a name given to ``torchrepro.log_metric``, ``metric_regex``: a group
    matched against stdout; default the final loss); ``observed`` and ``target_effect`` placed
    against the noise; ``until_clear`` with its budget ``max_runs``; ``collect``: analyse the runs
    already in that directory instead; ``plan_only``: write the plan and run nothing."""

    script: Path | None
    args: list[str] = field(default_factory=list)
    vary: list[str] | None = None
    runs: int | None = None
    seed: int = 0
    out: Path | None = None
    jobs: int | None = None  # None: the usable cores
    launcher: str = "local"
    metric: str | None = None
    metric_regex: str | None = None
    observed: float | None = None
    target_effect: float | None = None
    allow_large: bool = False
    until_clear: bool = False
    max_runs: int | None = None
    collect: Path | None = None
    allow_partial: bool = False  # --collect with runs of the plan missing: analyse those that finished
    plan_only: bool = False
    module: str | None = None  # -m MODULE: the module run as python -m runs it (``script``: its file)

    def __post_init__(self) -> None:
        """:class:`UserError` for values the command's options would refuse."""
        from ...analysis.drift import BINARY_FACTORS, RANDOM_FACTORS

        known = (*RANDOM_FACTORS, *BINARY_FACTORS)
        unknown = [n for n in self.vary or () if n not in known]
        if unknown or (self.vary is not None and len(set(self.vary)) != len(self.vary) or self.vary == []):
            raise UserError(f"--vary {','.join(self.vary or [])}: give each of {', '.join(known)} at most once")
        for name, value, low in (("runs", self.runs, 2), ("jobs", self.jobs, 1), ("max_runs", self.max_runs, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise UserError(f"{name} must be an integer of at least {low}, got {value!r}")
        if self.metric and self.metric_regex:
            raise UserError("give --metric or --metric-regex, not both")
        if self.launcher not in ("local", "ray"):
            raise UserError(f"launcher must be local or ray, got {self.launcher!r}")
        if self.collect is not None and (self.until_clear or self.plan_only):
            raise UserError("--collect DIR analyses stored runs: no --until-clear or --plan with it")
        if self.launcher == "local" and self.jobs is not None and (problem := over_process_limit(self.jobs)):
            raise UserError(f"argument --jobs: {problem}, got '{self.jobs}'")  # (Ray tasks run on its cluster)

    @property
    def parallel(self) -> int:
        """Runs at a time: ``jobs``, else the usable cores."""
        from ...eventlog.rundir import usable_cores

        return self.jobs or usable_cores()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DriftRequest:
        """The request ``drift``'s flags make (each field the flag of its name; ``--plan``: ``plan_only``)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
        for name in ("script", "out", "collect"):
            if name in given:
                given[name] = Path(given[name])
        return cls(**{"script": None, **given, "plan_only": args.plan})


def _metric(request: DriftRequest, plan: Plan | None = None) -> MetricSpec:
    from .experiment import MetricSpec

    if request.metric or request.metric_regex or plan is None:
        return MetricSpec(request.metric, request.metric_regex)
    return MetricSpec(**plan["metric"])


def experiment(request: DriftRequest) -> tuple[DriftReport, Path] | None:
    """Plan and run the experiment, or collect one, as ``request`` says: the report and the
    experiment's directory (None for ``plan_only``: the plan was written and said, nothing run)."""
    from ...eventlog.rundir import claim_run_dir
    from .experiment import load_plan

    if request.collect:
        if request.script:
            raise UserError("--collect DIR analyses stored runs: give no SCRIPT")
        run_dir = Path(request.collect)
        plan = load_plan(run_dir)
        claim_run_dir(run_dir, fresh=False)  # one writer of the report at a time
        return _report(run_dir, plan, request, None, None)
    return _plan_and_run(request)


def _plan_and_run(request: DriftRequest) -> tuple[DriftReport, Path] | None:
    from ...analysis.drift import DEFAULT_FACTORS
    from .experiment import check_run_dir, make_plan, plan_size, prepare_run_dir, sequential_stop
    from ..launcher import validate_script
    from ...eventlog.rundir import claim_run_dir, default_run_dir

    if not request.script:
        raise UserError("drift needs a SCRIPT (or --collect DIR, or --run-one INDEX --out DIR)")
    if request.max_runs is not None and not request.until_clear:
        raise UserError("--max-runs is the budget of --until-clear: give both, or --runs N for a fixed design")
    script = validate_script(request.script)
    factors = request.vary or DEFAULT_FACTORS.split(",")
    levels = request.runs or 4

    def planned(n: int, sequential: SequentialPlan | None = None) -> Plan:
        return make_plan(
            script,
            request.args,
            factors,
            n,
            request.seed,
            _metric(request),
            None if request.allow_large else MAX_RUNS,
            sequential,
            request.module,
        )

    plan = planned(levels)
    if request.until_clear:
        budget = request.max_runs or DEFAULT_BUDGET
        _check_sequential(plan, factors, budget)
    run_dir = Path(request.out) if request.out else default_run_dir(script, label="drift")
    check_run_dir(run_dir, plan)  # before anything is created in it
    claim_run_dir(run_dir, fresh=False)  # one drift writes it at a time (--run-one: cells)
    if request.plan_only:
        _print_plan(run_dir, plan, request)
        return None
    from ...render.console import console as make_console

    console = make_console(stderr=True)
    t0 = time.perf_counter()
    if not request.until_clear:
        prepare_run_dir(run_dir, plan)  # under the lock: an empty directory, or this experiment's
        counts = _launch(run_dir, plan, request, console, t0)
        return _report(run_dir, plan, request, counts, round(time.perf_counter() - t0, 3))
    looks, total = [levels], {"planned": 0, "reused": 0, "ran": 0, "crashed": 0}
    while True:
        sequential: SequentialPlan = {"looks": looks, "max_runs": budget, "target_effect": request.target_effect}
        plan = planned(looks[-1], sequential)
        prepare_run_dir(run_dir, plan)
        counts = _launch(run_dir, plan, request, console, t0)
        ran, crashed = total["ran"] + counts["ran"], total["crashed"] + counts["crashed"]
        total = {"planned": counts["planned"], "reused": counts["planned"] - ran, "ran": ran, "crashed": crashed}
        stop = sequential_stop(run_dir, plan, _metric(request, plan), request.target_effect)
        if stop != "continue":
            break
        levels = next_levels(plan, looks[-1], request.parallel)
        while plan_size(plan, levels) > budget:  # a last batch cut to the budget (one more level fits: not "budget")
            levels -= 1
        looks = [*looks, levels]
    return _report(run_dir, plan, request, total, round(time.perf_counter() - t0, 3))


def _check_sequential(plan: Plan, factors: list[str], budget: int) -> None:
    """One-line errors for an ``--until-clear`` that could decide nothing or exceed its budget at once."""
    from .experiment import plan_size

    if not plan["binary"] and len(plan["random"]) not in (2, 3):
        raise UserError(
            f"--until-clear --vary {','.join(factors)}: nothing to decide; it needs a binary factor "
            "(compile, backend, ...) or two or three random factors (init,order,augment)"
        )
    first = plan_size(plan, plan["runs"])
    if budget < first:
        raise UserError(f"--max-runs {budget} is smaller than the first look ({first} runs at --runs {plan['runs']})")


def next_levels(plan: Plan, levels: int, jobs: int) -> int:
    """The levels of the next look: as many more as fit in one batch of ``jobs`` runs, at least one."""
    from .experiment import plan_size

    n = levels + 1
    while plan_size(plan, n + 1) - plan_size(plan, levels) <= jobs:
        n += 1
    return n


def _launch(run_dir: Path, plan: Plan, request: DriftRequest, console: Console, t0: float) -> dict[str, int]:
    """Run what ``plan`` still lacks. A stop signal (SIGINT, SIGTERM, SIGHUP) ends the live runs (they
    rerun next time); the report of the runs that finished is written, marked partial, and drift
    ends with :class:`Stopped` (exit 128 + N)."""
    from .experiment import run_all
    from ..launcher import stop_phase

    try:
        with stop_phase("drift"):
            return run_all(run_dir, plan, request.parallel, console, request.launcher)
    except Stopped as stopped:
        how = f"stopped by {stopped.signal_name}"
        _report(run_dir, plan, request, None, round(time.perf_counter() - t0, 3), partial=how)
        raise Stopped(
            f"drift: {how}; finished runs are kept in {run_dir} (partial report: {run_dir / REPORT_FILE}): "
            "run the same command again to go on",
            stopped.signal_name,
        ) from None


def _print_plan(run_dir: Path, plan: Plan, request: DriftRequest) -> None:
    """``--plan``: write the run matrix; with finished runs in ``run_dir`` (a pilot), say how many runs
    each factor needs."""
    from ...analysis.drift import fmt_number
    from ...analysis.sequential import plan_sentence
    from .experiment import pilot_planning, prepare_run_dir

    pilot = pilot_planning(
        run_dir, plan, _metric(request, plan), request.target_effect, request.observed, request.parallel
    )
    prepare_run_dir(run_dir, plan)  # under the lock: an empty directory, or this experiment's
    n = len(plan["cells"])
    print(
        f"{n} runs planned in {run_dir / 'plan.json'}\nrun each cell: torchrepro drift --out {run_dir} --run-one I "
        f"(I = 0..{n - 1})\nthen: torchrepro drift --collect {run_dir}"
    )
    if pilot is None:
        print("runs needed: no finished runs in this directory yet (run a pilot, e.g. --runs 4, then --plan again)")
    for item in pilot or []:
        print(plan_sentence(item, fmt_number))


def _report(
    run_dir: Path,
    plan: Plan,
    request: DriftRequest,
    counts: dict[str, int] | None,
    wall_s: float | None,
    partial: str | None = None,
) -> tuple[DriftReport, Path]:
    """Collect and analyse the runs (``report.json``, ``report.html`` and the plots are written);
    a :class:`UserError` when no run produced the metric and none crashed. ``partial``: why the
    runs were cut short (the report says it is partial)."""
    from .experiment import build_report, collect

    metric = _metric(request, plan)
    runs = collect(run_dir, plan, metric)
    report = build_report(
        run_dir,
        plan,
        runs,
        metric,
        observed=request.observed,
        target_effect=request.target_effect,
        counts=counts,
        wall_s=wall_s,
        partial=partial,
        allow_partial=request.allow_partial,
    )
    drift = report.drift
    if partial is None and report.exit_code != 3 and not drift.summary["n"] and drift.excluded:
        raise UserError(f"no run produced the metric: {drift.excluded[0].error}")
    return report, run_dir
