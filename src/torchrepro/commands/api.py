"""Every command as a typed Python function: ``torchrepro.doctor``, ``check``, ``check_resume``,
``compare``, ``diff``, ``drift``, ``record_golden`` and ``check_golden`` run exactly what the command
of that name runs and return its typed report (:mod:`torchrepro.reports`); nothing is printed but the
progress lines the command shows on stderr. This module is the one place a command's request is built
from Python values: each command's ``run(args)`` turns its flags into a call here.

A usage error (a missing script, a value out of range, options that exclude each other) raises
:class:`~torchrepro.errors.UserError` (``InputError`` for an unreadable input) before anything runs;
a signal that stops a job raises :class:`~torchrepro.errors.Stopped`. A run that fails or differs is
not an exception: the report says so (``report.verdict``, ``report.exit_code``).

>>> report = torchrepro.check("train.py", ["--steps", "20"])  # doctest: +SKIP
>>> report.verdict.value, report.exit_code  # doctest: +SKIP
('bit_exact', 0)
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar, Union

from ..errors import UserError
from .options import over_process_limit
from ..runtime.run_options import PROBE_REPEATS, RunOptions

if TYPE_CHECKING:
    from ..analysis.divergence import Tolerance
    from ..reports.check_report import CheckReport
    from ..reports.compare_report import CompareReport
    from ..reports.doctor_report import DoctorReport
    from ..reports.drift_report import DriftReport
    from ..eventlog.golden_dir import GoldenManifest
    from ..reports.golden_report import GoldenReport

PathLike = Union[str, "os.PathLike[str]"]
Script = Union[PathLike, tuple[PathLike, Sequence[str]]]  # compare's sides: a script, or a script and its arguments


@dataclass(frozen=True)
class CompileCache:
    """Which compile-cache directory each rank of a run uses (``--cache-policy``: ``per-node``,
    ``shared`` or ``per-rank``; ``--cache-root``), and a signed warm-start pack unpacked first
    (``--warm-from``; ``allow_unsigned``: a pack no trusted key signed too). docs/cache.md."""

    policy: str | None = None
    root: PathLike | None = None
    warm_from: PathLike | None = None
    allow_unsigned: bool = False
    warm_start_skipped: str | None = None  # why a --warm-from pack was kept from the runs (the command said why)


def cache_of(args: argparse.Namespace) -> CompileCache:
    """The :class:`CompileCache` a command's ``--cache-policy``, ``--cache-root``, ``--warm-from`` and
    ``--allow-unsigned`` say."""
    return CompileCache(
        args.cache_policy,
        args.cache_root,
        args.warm_from,
        args.allow_unsigned,
        getattr(args, "warm_start_skipped", None),
    )


def _options(seed: int | None, cache: CompileCache | None, module: str | None = None, **values: object) -> RunOptions:
    """The :class:`RunOptions` every run of a command starts from (paths made absolute; ``module``:
    the script is run as ``python -m MODULE``)."""
    if seed is not None and not (isinstance(seed, int) and 0 <= seed < 2**128):
        raise UserError(f"seed must be an integer >= 0 (and < 2**128), got {seed!r}")
    cache = cache or CompileCache()
    if cache.policy not in (None, "per-node", "shared", "per-rank"):
        raise UserError(f"cache policy must be per-node, shared or per-rank, got {cache.policy!r}")
    return RunOptions(
        seed=seed,
        cache_policy=cache.policy,
        cache_root=str(Path(cache.root).resolve()) if cache.root is not None else None,
        warm_from=str(Path(cache.warm_from).resolve()) if cache.warm_from is not None else None,
        allow_unsigned=cache.allow_unsigned,
        warm_start_skipped=cache.warm_start_skipped,
        module=module,
        **values,  # type: ignore[arg-type]
    )


def _positive(name: str, value: float | None, low: float = 1) -> None:
    if value is not None and (isinstance(value, bool) or not value >= low):
        raise UserError(f"{name} must be at least {low:g}, got {value!r}")


def _processes(name: str, value: int | None) -> None:
    """A count of processes started at once: at least 1, and within this machine's bound (the one
    ``--nproc`` has: :func:`~torchrepro.commands.options.over_process_limit`)."""
    _positive(name, value)
    if value is not None and (problem := over_process_limit(value)) is not None:
        raise UserError(f"{name} {value}: {problem}")


def _script(script: PathLike | None, module: str | None) -> Path:
    """The script a command runs: ``script``, or the file ``python -m MODULE`` runs."""
    if script is not None:
        return Path(script)
    if module is None:
        raise UserError("give a SCRIPT to run (or -m MODULE)")
    from argparse import ArgumentTypeError

    from .options import module_script

    try:
        return Path(module_script(module))
    except ArgumentTypeError as exc:
        raise UserError(str(exc)) from None


def _out(out: PathLike | None) -> Path | None:
    return Path(out) if out is not None else None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _holds_its_run_dir_while_it_runs(command: Callable[_P, _R]) -> Callable[_P, _R]:
    """A command lets go of the run directories it wrote when it returns (or raises), as its process
    would by ending: the caller's process lives on, and another process may read them, or this one
    call a command with the same ``out`` again (refused: not empty)."""

    @functools.wraps(command)
    def holding(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        from ..eventlog.rundir import run_dirs_let_go

        with run_dirs_let_go():
            return command(*args, **kwargs)

    return holding


def _names(what: str, names: Sequence[str] | None, known: Sequence[str]) -> list[str] | None:
    """``names`` checked against ``known`` (a :class:`UserError` naming the unknown ones)."""
    if names is None:
        return None
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise UserError(f"{what}: unknown name {', '.join(unknown) or '(none given)'} (choose from {', '.join(known)})")
    return list(names)


# --- doctor -------------------------------------------------------------------------------------


@_holds_its_run_dir_while_it_runs
def doctor(
    script: PathLike | None = None,
    args: Sequence[str] = (),
    *,
    trace: PathLike | None = None,
    out: PathLike | None = None,
    seed: int | None = None,
    nproc: int = 1,
    timeout: float | None = None,
    max_graph_breaks: int | None = None,
    max_recompiles: int | None = None,
    min_cache_hit_rate: float | None = None,
    strict: bool = False,
    fingerprint_every: int | None = None,
    probe_repeats: int | None = None,
    fixes: bool = False,
    only_fixes: Sequence[str] | None = None,
    jobs: int = 1,
    cache: CompileCache | None = None,
    module: str | None = None,
) -> DoctorReport:
    """``torchrepro doctor``: run ``script`` with ``args`` under capture (or read the ``TORCH_TRACE``
    logs in ``trace``) and report its compile health, held to the budgets given
    (``max_graph_breaks``, ``max_recompiles``, ``min_cache_hit_rate``; ``strict``: degraded capture
    fails too). ``probe_repeats``: call each compiled graph again that many times (``--probe``;
    None: no probe); ``fixes``: try each mechanical compile fix in a run of its own (``only_fixes``:
    those named; ``jobs`` side by side). The report is also written to ``out/report.json``."""
    from ..analysis.compile_fixes import COMPILE_FIXES
    from ..analysis.doctor import Budgets
    from .doctor.job import doctor_from_trace, doctor_script

    only = _names("--only-fixes", only_fixes, list(COMPILE_FIXES))
    _processes("nproc", nproc)
    _positive("jobs", jobs)
    if (only or jobs != 1) and not fixes:
        raise UserError("--only-fixes and --jobs choose the fix runs of --fixes: give --fixes too")
    if (problem := over_process_limit(jobs * nproc)) is not None:  # fix runs side by side
        raise UserError(f"--jobs {jobs} x --nproc {nproc} = {jobs * nproc} processes at once: {problem}")
    budgets = Budgets(max_graph_breaks, max_recompiles, min_cache_hit_rate, strict=strict)
    if trace is not None:
        if fixes:
            raise UserError("--fixes re-runs the script: give a SCRIPT, not --trace")
        if script is not None or module is not None:
            raise UserError("give either --trace DIR or a SCRIPT, not both")
        return doctor_from_trace(Path(trace), _out(out), budgets)[0]
    if script is None and module is None:
        raise UserError("doctor needs a SCRIPT to run (or --trace DIR)")
    options = _options(seed, cache, module, fingerprint_every=fingerprint_every, probe_repeats=probe_repeats or 0)
    report, run_dir = doctor_script(
        _script(script, module),
        list(args),
        run_dir=_out(out),
        budgets=budgets,
        options=replace(options, ranks_only=True),
        nproc=nproc,
        timeout=timeout,
        resume=fixes,
    )
    if fixes:
        from .doctor.fix_runs import FixRunner, try_fixes_stored

        runner = FixRunner(run_dir, _script(script, module), list(args), options, nproc=nproc, timeout=timeout)
        try_fixes_stored(report, runner, only=only, jobs=jobs)
    return report


# --- check, check-resume, diff ------------------------------------------------------------------


@_holds_its_run_dir_while_it_runs
def check(
    script: PathLike | None,
    args: Sequence[str] = (),
    *,
    runs: int | None = None,
    against: str | None = None,
    seed: int | None = None,
    out: PathLike | None = None,
    nproc: int = 1,
    timeout: float | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    localize: bool = True,
    fixes: bool | None = None,
    only_fixes: Sequence[str] | None = None,
    probe_repeats: int = PROBE_REPEATS,
    disk_budget: int | None = None,
    cache: CompileCache | None = None,
    module: str | None = None,
) -> CheckReport:
    """``torchrepro check``: run ``script`` with ``args`` ``runs`` times (default 2), or once against
    ``against`` (``"eager"`` or ``"fallback-random"``), compare them bit for bit (within ``rtol``/``atol``
    when given) and explain the first divergence (``localize``: replay it op by op). ``fixes``: try
    the fix ladder after a divergence (None: for causes a fix can address), limited to ``only_fixes``;
    ``probe_repeats``: calls of each compiled graph again on identical inputs (0: none);
    ``disk_budget``: bytes the runs may need, in place of the estimate. Written to ``out``."""
    from ..analysis.fix_ranking import LADDER
    from .check.comparison import CheckRequest, check as run_check

    if runs is not None and against:
        raise UserError(
            "--runs counts runs of the script as written: with --against there are always two "
            "(the reference and the compiled run)"
        )
    if against not in (None, "eager", "fallback-random"):
        raise UserError(f"--against must be eager or fallback-random, got {against!r}")
    _positive("runs", runs, 2)
    _processes("nproc", nproc)
    _positive("probe_repeats", probe_repeats, 0)
    request = CheckRequest(
        _script(script, module),
        list(args),
        runs=runs or 2,
        options=_options(seed, cache, module),
        against=against,
        run_dir=_out(out),
        tolerance=_tolerance(rtol, atol),
        localize_divergence=localize,
        nproc=nproc,
        timeout=timeout,
        fixes=fixes,
        only_fixes=_names("--fixes", only_fixes, list(LADDER)),
        probe_repeats=probe_repeats,
        disk_budget=disk_budget,
    )
    return run_check(request)[0]


def _tolerance(rtol: float, atol: float) -> Tolerance:
    from ..analysis.divergence import Tolerance

    for name, value in (("rtol", rtol), ("atol", atol)):
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf")):
            raise UserError(f"{name} must be a number >= 0, got {value!r}")
    return Tolerance(float(rtol), float(atol))


@_holds_its_run_dir_while_it_runs
def check_resume(
    script: PathLike | None,
    args: Sequence[str] = (),
    *,
    at: int,
    seed: int | None = None,
    out: PathLike | None = None,
    nproc: int = 1,
    timeout: float | None = None,
    cache: CompileCache | None = None,
    module: str | None = None,
) -> CheckReport:
    """``torchrepro check-resume``: run ``script`` to the end, again stopping after step ``at`` with a
    checkpoint (``torchrepro.checkpoint``), resume in a fresh process and compare bit for bit."""
    from .check.comparison import check_resume as run_check_resume

    _processes("nproc", nproc)
    return run_check_resume(
        _script(script, module),
        list(args),
        at=at,
        options=_options(seed, cache, module),
        run_dir=_out(out),
        nproc=nproc,
        timeout=timeout,
    )[0]


def diff(run_a: PathLike, run_b: PathLike, *, rtol: float = 0.0, atol: float = 0.0) -> CheckReport:
    """``torchrepro diff``: compare two stored run directories (no replay: what their logs and
    snapshots hold), bit for bit or within ``rtol``/``atol``."""
    from ..eventlog.rundir import refuse_while_written
    from .check.comparison import diff as run_diff

    for run_dir in (run_a, run_b):  # a run another torchrepro is still writing is not read as finished
        refuse_while_written(Path(run_dir))
    return run_diff(Path(run_a), Path(run_b), _tolerance(rtol, atol))


# --- compare ------------------------------------------------------------------------------------


@_holds_its_run_dir_while_it_runs
def compare(
    a: Script,
    b: Script,
    *,
    nproc: int = 1,
    nproc_b: int | None = None,
    resume_b_at: int | None = None,
    seed: int | None = None,
    out: PathLike | None = None,
    timeout: float | None = None,
    cache: CompileCache | None = None,
    module: str | None = None,
    module_b: str | None = None,
) -> CompareReport:
    """``torchrepro compare``: is configuration ``b`` the same training as ``a``? Each is a script or
    ``(script, args)``; A runs twice on ``nproc`` ranks, B once on ``nproc_b`` (default ``nproc``;
    ``resume_b_at``: stopped after that step and resumed), and B is judged against A's band.
    ``module``/``module_b``: A's/B's script is run as ``python -m`` that module."""
    from .compare_runs import compare as run_compare

    _processes("nproc", nproc)
    _processes("nproc_b", nproc_b)
    _positive("resume_b_at", resume_b_at)

    def side(given: Script, ranks: int) -> tuple[Path, list[str], int]:
        if isinstance(given, tuple):
            return Path(given[0]), list(given[1]), ranks
        return Path(given), [], ranks

    report, _ = run_compare(
        side(a, nproc),
        side(b, nproc_b or nproc),
        options=_options(seed, cache, module),
        run_dir=_out(out),
        resume_b_at=resume_b_at,
        timeout=timeout,
        module_b=module_b,
    )
    return report


# --- drift --------------------------------------------------------------------------------------


@_holds_its_run_dir_while_it_runs
def drift(
    script: PathLike | None = None,
    args: Sequence[str] = (),
    *,
    vary: Sequence[str] | None = None,
    runs: int | None = None,
    seed: int = 0,
    out: PathLike | None = None,
    jobs: int | None = None,
    launcher: str = "local",
    metric: str | None = None,
    metric_regex: str | None = None,
    observed: float | None = None,
    target_effect: float | None = None,
    allow_large: bool = False,
    until_clear: bool = False,
    max_runs: int | None = None,
    collect: PathLike | None = None,
    allow_partial: bool = False,
    module: str | None = None,
) -> DriftReport:
    """``torchrepro drift``: run ``script`` ``runs`` seeds per factor of ``vary`` (default init,
    order, compile), ``jobs`` at a time, and say which factor makes a real difference to the metric
    (``metric``: a name logged with ``torchrepro.log_metric``; ``metric_regex``: a group matched
    against stdout; default the final loss). ``until_clear``: add seeds until each factor is decided,
    at most ``max_runs`` runs; ``collect``: analyse the runs already in that directory instead (the
    report INCOMPLETE when runs of its plan are missing, unless ``allow_partial``)."""
    from .drift.conduct import DriftRequest, experiment

    request = DriftRequest(
        _script(script, module) if script is not None or module is not None else None,
        list(args),
        vary=list(vary) if vary is not None else None,
        runs=runs,
        seed=seed,
        out=_out(out),
        jobs=jobs,
        launcher=launcher,
        metric=metric,
        metric_regex=metric_regex,
        observed=observed,
        target_effect=target_effect,
        allow_large=allow_large,
        until_clear=until_clear,
        max_runs=max_runs,
        collect=_out(collect),
        allow_partial=allow_partial,
        module=module,
    )
    found = experiment(request)
    assert found is not None  # None only for a plan_only request (drift --plan)
    return found[0]


# --- golden -------------------------------------------------------------------------------------


@_holds_its_run_dir_while_it_runs
def record_golden(
    script: PathLike | None,
    args: Sequence[str] = (),
    *,
    out: PathLike,
    band: bool = False,
    seed: int | None = None,
    nproc: int = 1,
    timeout: float | None = None,
    snapshot_budget: int = 0,
    force: bool = False,
    cache: CompileCache | None = None,
    module: str | None = None,
) -> GoldenManifest:
    """``torchrepro golden record``: run ``script`` with ``args`` as ``check`` runs it (``band``: twice,
    for its run-to-run band) and keep the run as the golden directory ``out`` (``force``: replace the
    golden run there). ``snapshot_budget``: bytes of parameter snapshots kept (default none). The
    manifest written to ``out/golden.json``: versions, device, world size, steps and sizes."""
    from .golden.record import record_golden as run_record

    _processes("nproc", nproc)
    _positive("snapshot_budget", snapshot_budget, 0)
    return run_record(
        _script(script, module),
        list(args),
        Path(out),
        options=_options(seed, cache, module),
        band=band,
        snapshot_budget=snapshot_budget,
        nproc=nproc,
        timeout=timeout,
        force=force,
    )


@_holds_its_run_dir_while_it_runs
def check_golden(
    golden: PathLike,
    script: PathLike | None,
    args: Sequence[str] = (),
    *,
    out: PathLike | None = None,
    nproc: int | None = None,
    timeout: float | None = None,
    localize: bool = True,
    cache: CompileCache | None = None,
    module: str | None = None,
) -> GoldenReport:
    """``torchrepro golden check``: run ``script`` with ``args`` again (with the golden's seed, on its
    number of ranks unless ``nproc`` says otherwise) and judge the run against the golden directory
    ``golden``: BIT-EXACT, WITHIN BAND, DIVERGED or NOT COMPARABLE (``report.verdict``). The run and
    its report go to ``out`` (``report.run_dir``; None when nothing was run). ``localize``: replay a
    divergent step with op capture when neither the script nor the environment changed."""
    from .golden.verify import check_golden as run_check_golden

    _processes("nproc", nproc)
    return run_check_golden(
        Path(golden),
        _script(script, module),
        list(args),
        options=_options(None, cache, module),
        run_dir=_out(out),
        nproc=nproc,
        timeout=timeout,
        localize=localize,
    )[0]
