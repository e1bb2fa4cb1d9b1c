"""The runs of ``torchrepro compare``: configuration A (the reference) twice and B once (B stopped and
resumed when asked), judged by :func:`torchrepro.analysis.equivalence.judge` against A's run-to-run
band (docs/compare.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..runtime.run_options import RunOptions

if TYPE_CHECKING:
    from ..reports.compare_report import CompareReport


Side = tuple[Path, list[str], int]  # script, its arguments, ranks


def compare(
    a: Side,
    b: Side,
    *,
    options: RunOptions = RunOptions(),
    run_dir: Path | None = None,
    resume_b_at: int | None = None,
    timeout: float | None = None,
    console: Any = None,
    module_b: str | None = None,
) -> tuple[CompareReport, Path]:
    """Run A twice and B once (B stopped and resumed when ``resume_b_at``); the report, also
    written to ``RUN_DIR/report.json``. ``options.module`` is how A runs, ``module_b`` how B runs
    (``-m MODULE``: the side's script is that module's file)."""
    from .launcher import validate_script

    script_a, script_b = validate_script(a[0]), validate_script(b[0])  # before the imports a run needs

    from ..analysis.equivalence import Config, compare_report, judge
    from ..checkpoint import ENV_RESUME_FROM, ENV_SAVE_TO, ENV_STOP_AT
    from ..eventlog.provenance import launch_meta, provenance
    from ..eventlog.rundir import create_run_dir, default_run_dir
    from ..render.console import console as make_console
    from ..render.save import write_report
    from .check.runs import Checker, RunSpec

    console = console or make_console(stderr=True)
    run_dir = create_run_dir(run_dir or default_run_dir(script_a, label="compare"))

    def checker(script: Path, script_args: list[str], nproc: int, module: str | None) -> Checker:
        return Checker(
            script,
            script_args,
            run_dir,
            options=replace(options, whole_snapshots=True, module=module),  # each tensor judged at each snapshot step
            snapshots=True,
            console=console,
            nproc=nproc,
            timeout=timeout,
        )

    ref, other = checker(script_a, a[1], a[2], options.module), checker(script_b, b[1], b[2], module_b)
    specs = [RunSpec("a-1", None, f"A, run 1 of 2 ({a[2]} rank(s))"), RunSpec("a-2", None, "A, run 2 of 2")]
    (run_a1, _), (run_a2, _) = ref.run_all(specs)
    if resume_b_at is None:
        run_b, _ = other.run(RunSpec("b", None, f"B ({b[2]} rank(s))"))
        b_dirs = {"b": str(run_dir / "b")}
    else:
        saved = run_dir / "checkpoint-b"
        other.run(
            RunSpec("b-stopped", None, f"B, stopping after step {resume_b_at}"),
            env={ENV_STOP_AT: str(resume_b_at), ENV_SAVE_TO: str(saved)},
        )
        if not list(saved.glob("position-rank*.json")):
            raise InputError(
                f"B saved no checkpoint after step {resume_b_at}: it must call torchrepro.checkpoint.save() "
                "when checkpoint.plan().should_stop(step) (see examples/resume_ddp.py)"
            )
        run_b, _ = other.run(
            RunSpec("b", None, f"B, resumed after step {resume_b_at}"), env={ENV_RESUME_FROM: str(saved)}
        )
        b_dirs = {"b-stopped": str(run_dir / "b-stopped"), "b": str(run_dir / "b"), "checkpoint": str(saved)}
    endings = {**ref.endings, **other.endings}
    configs = [
        Config(label, run.logs, endings[label]) for label, run in (("a-1", run_a1), ("a-2", run_a2), ("b", run_b))
    ]
    section = judge(*configs)
    section["configs"] = {
        "a": {"script": str(script_a), "args": a[1], "nproc": a[2], "world": len(run_a1.logs)},
        "b": {"script": str(script_b), "args": b[1], "nproc": b[2], "world": len(run_b.logs)}
        | ({"resumed_after": resume_b_at} if resume_b_at is not None else {}),
    }
    meta = {**launch_meta(script_a), "seed": options.seed, **options.warm_start_meta}
    report = compare_report(
        section,
        {"a-1": str(run_dir / "a-1"), "a-2": str(run_dir / "a-2"), **b_dirs},
        {**ref.timings, **other.timings},
        meta,
        configs,
    )
    report.provenance = provenance({**run_a1.meta, **meta}, run_a1.logs[0].header if run_a1.logs else None)
    write_report(run_dir, report)
    return report, run_dir
