"""The `torchrepro` command: parse arguments, dispatch, turn user errors into one line.

Exit codes: 0 ok; 1 analysed and fails a budget, hits the recompile limit, or is not
reproducible; 2 usage or input error; 3 the user's script failed; 128+N a signal N to torchrepro
stopped the job (forwarded to all of it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__, options
from .errors import UserError
from .otlp import add_otlp_option, export_stored_run, record_report, run_with_export
from .safe_text import visible

if TYPE_CHECKING:
    from .report.model import CheckReport, DoctorReport, Report


def _cmd_env(args: argparse.Namespace) -> int:
    from . import envinfo
    from .report.env import render_env

    info = envinfo.collect()
    if args.json:
        envinfo.write_json(info, sys.stdout)
    else:
        render_env(info)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .capture.session import CaptureConfig, rank_info
    from .capture.steps import StepConfig
    from .events import EVENTS_FILE
    from .launch import validate_script, run_in_process

    script = validate_script(args.script)
    run_dir = Path(args.out) if args.out else _shared_run_dir(script)
    log = run_dir / f"rank-{rank_info()[0]}" / EVENTS_FILE
    if log.exists():
        raise UserError(f"{run_dir} already holds a run ({log} exists): choose another --out, or delete it")
    config = CaptureConfig(
        run_dir=run_dir, seed=args.seed, compile_mode=args.compile_mode,
        steps=StepConfig(fingerprint_every=args.fingerprint_every, grads=args.grads,
                         snapshots=args.snapshots),
        replay_step=args.replay_step, replay_out=Path(args.replay_out) if args.replay_out else None,
        replay_graphs=args.replay_graphs, replay_kernels=args.replay_kernels,
        stop_after_step=args.stop_after_step, fix=args.fix)
    return run_in_process(script, args.args, config)


def _shared_run_dir(script: Path) -> Path:
    """Under torchrun every rank must agree on the directory: key it by the job's run id."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID") or time.strftime("%Y%m%d-%H%M%S")
    return Path("torchrepro-runs") / f"{script.stem}-{run_id}"


def _budgets(args: argparse.Namespace):
    from .analysis.doctor import Budgets

    return Budgets(args.max_graph_breaks, args.max_recompiles, args.min_cache_hit_rate, strict=args.strict)


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor_from_trace, doctor_script

    budgets = _budgets(args)
    if args.trace:
        if args.script:
            raise UserError("give either --trace DIR or a SCRIPT, not both")
        report, run_dir = doctor_from_trace(Path(args.trace), Path(args.out) if args.out else None, budgets)
    else:
        if not args.script:
            raise UserError("doctor needs a SCRIPT to run (or --trace DIR)")
        report, run_dir = doctor_script(Path(args.script), args.args, out=Path(args.out) if args.out else None,
                                        budgets=budgets, seed=args.seed, fingerprint_every=args.fingerprint_every,
                                        nproc=args.nproc, timeout=args.timeout, env=_cache_env(args))
    return _finish(report, run_dir, args)


def _tolerance(args: argparse.Namespace):
    from .analysis.divergence import Tolerance

    return Tolerance(args.rtol, args.atol)


def _finish_check(report: CheckReport, args: argparse.Namespace, out: Path | None = None) -> int:
    from .report.terminal import render_check
    from .rundir import write_json

    if args.json:
        write_json(Path(args.json), report.to_json())
    _write_html_option(report, args)
    record_report(report)
    render_check(report, report_path=_report_paths(out) if out else (getattr(args, "html", None) or args.json))
    return report.exit_code


def _cmd_check(args: argparse.Namespace) -> int:
    from .check import check

    if args.runs is not None and args.against:
        raise UserError("--runs counts runs of the script as written: with --against there are always two "
                        "(the reference and the compiled run)")
    report, out = check(Path(args.script), args.args, runs=args.runs or 2, seed=args.seed, against=args.against,
                        out=Path(args.out) if args.out else None, tolerance=_tolerance(args),
                        localize_divergence=not args.no_localize, nproc=args.nproc, timeout=args.timeout,
                        env=_cache_env(args), fixes=False if args.no_fixes else (True if args.fixes else None),
                        only_fixes=_fix_names(args.only_fixes))
    return _finish_check(report, args, out)


def _fix_names(value: str | None) -> list[str] | None:
    """``--only-fixes threads_1,eager`` → those names (checked); None → every candidate."""
    from .analysis.fixes import LADDER

    if not value:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in LADDER]
    if unknown:
        raise UserError(f"--fixes: unknown fix {', '.join(unknown)} (choose from {', '.join(LADDER)})")
    return names


def _cmd_check_resume(args: argparse.Namespace) -> int:
    from .check import check_resume

    report, out = check_resume(Path(args.script), args.args, at=args.at, seed=args.seed,
                               out=Path(args.out) if args.out else None, nproc=args.nproc, timeout=args.timeout,
                               env=_cache_env(args))
    return _finish_check(report, args, out)


def _cmd_diff(args: argparse.Namespace) -> int:
    from .check import diff

    return _finish_check(diff(Path(args.run_a), Path(args.run_b), _tolerance(args)), args)


def _cmd_report(args: argparse.Namespace) -> int:
    from .doctor import analyse_run_dir

    from .analysis.doctor import Budgets
    from .commands.drift import rerender

    run_dir = Path(args.run_dir)
    if (code := rerender(run_dir, args)) is not None:  # a drift experiment: its stored report
        return code
    report = analyse_run_dir(run_dir, Budgets(strict=args.strict), store=False)
    export_stored_run(run_dir)
    return _finish(report, None, args)


def _finish(report: DoctorReport, run_dir: Path | None, args: argparse.Namespace) -> int:
    """Write ``--json``/``--junit``, render, and the exit code; ``run_dir``: where the report was stored."""
    from .report.junit import write_junit
    from .report.terminal import render_doctor
    from .rundir import write_json

    if args.json:
        write_json(Path(args.json), report.to_json())
    if args.junit:
        write_junit(report, Path(args.junit))
    _write_html_option(report, args)
    record_report(report)
    render_doctor(report, report_path=_report_paths(run_dir) if run_dir else (
        getattr(args, "html", None) or getattr(args, "json", None)))
    return report.exit_code


def _report_paths(directory: Path) -> str:
    """Where the report went: ``report.json`` and, when it was written, ``report.html``."""
    from .rundir import HTML_FILE, REPORT_FILE

    written = [str(directory / name) for name in (REPORT_FILE, HTML_FILE) if (directory / name).exists()]
    return ", ".join(written) or str(directory / REPORT_FILE)


def _write_html_option(report: Report, args: argparse.Namespace) -> None:
    """``--html FILE`` (report, diff): the HTML page there; an existing non-report file needs --force."""
    if getattr(args, "html", None):
        from .report.html import write_html

        write_html(report, Path(args.html), force=args.force)


def _add_html(p: argparse.ArgumentParser) -> None:
    p.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page here")


def _runs(text: str) -> int:
    runs = options.positive_int(text)
    if runs < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (there is nothing to compare with one run), got {text!r}")
    return runs


def _add_ranks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=options.positive_int, default=1, metavar="N",
                   help="launch N ranks with torchrun (standalone)")
    p.add_argument("--timeout", type=options.positive_float, metavar="S",
                   help="end the job after S seconds without progress, dumping every rank's Python stack")
    p.add_argument("--cache-policy", choices=("per-node", "shared", "per-rank"),
                   help="compile-cache directory per node (default when set), shared, or per rank")
    p.add_argument("--cache-root", type=options.directory, metavar="DIR",
                   help="where --cache-policy puts the cache directories")
    p.add_argument("--warm-from", type=options.pack_file, metavar="PACK",
                   help="unpack this torchrepro cache pack on every rank first")


def _cache_env(args: argparse.Namespace) -> dict[str, str]:
    """What the launched processes need to apply --cache-policy / --warm-from before compiling."""
    from .cache.policy import POLICY_VAR, PREWARM_POLICY, ROOT_VAR, WARM_VAR

    env = {}
    policy = args.cache_policy or (PREWARM_POLICY if args.warm_from else None)
    if policy:
        env[POLICY_VAR] = policy
    if args.cache_root:
        env[ROOT_VAR] = str(Path(args.cache_root).resolve())
    if args.warm_from:
        env[WARM_VAR] = str(Path(args.warm_from).resolve())
    return env


def _add_strict(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="fail (exit 1) when capture degraded (CAPTURE_DEGRADED: an observer failed, records unreadable)")


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse ``--json``/``--junit`` files that exist (unless ``--force``) or are inputs, before anything runs."""
    from .rundir import check_output

    named = ("script", "run_dir", "run_a", "run_b", "trace")
    inputs = [Path(v) for v in (getattr(args, name, None) for name in named) if v]
    paths = [Path(v) for v in (getattr(args, "json", None), getattr(args, "junit", None)) if isinstance(v, str)]
    if len(paths) == 2 and paths[0].resolve() == paths[1].resolve():
        raise UserError("--json and --junit name the same file")
    for path in paths:
        check_output(path, force=args.force, inputs=inputs)


def _add_tolerance(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rtol", type=options.tolerance, default=0.0, help="relative tolerance (default 0: bit-exact)")
    p.add_argument("--atol", type=options.tolerance, default=0.0, help="absolute tolerance (default 0: bit-exact)")


def _add_script(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("script", nargs=None if required else "?", metavar="SCRIPT", help="the training script")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments (after --)")


def build_parser() -> argparse.ArgumentParser:
    parser = options.Parser(
        prog="torchrepro",
        description="Reproducible torch.compile training, and why a run is not.",
        epilog="Exit codes: 0 ok, 1 fails a budget or not reproducible, 2 usage/input error, 3 script failed, "
               "128+N stopped by signal N (130 SIGINT, 143 SIGTERM).",
    )
    parser.add_argument("--version", action="version", version=f"torchrepro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    doctor = sub.add_parser("doctor", help="compile health of a real run: recompiles, graph breaks, caches")
    doctor.add_argument("--out", type=options.directory, metavar="RUN_DIR",
                        help="run directory (default torchrepro-runs/<time>-<script>)")
    options.add_outputs(doctor, junit=True)
    doctor.add_argument("--max-graph-breaks", type=options.count, metavar="N",
                        help="fail (exit 1) above N graph breaks")
    doctor.add_argument("--max-recompiles", type=options.count, metavar="N", help="fail (exit 1) above N recompiles")
    doctor.add_argument("--min-cache-hit-rate", type=options.fraction, metavar="F",
                        help="fail (exit 1) below this hit rate")
    doctor.add_argument("--seed", type=options.seed, help="seed everything from this root before the script starts")
    doctor.add_argument("--fingerprint-every", type=options.positive_int, metavar="N",
                        help="fingerprint parameters every N steps (default: every step if that costs < 1%%)")
    doctor.add_argument("--trace", metavar="DIR", help="build the report from TORCH_TRACE logs instead of a run")
    _add_strict(doctor)
    _add_ranks(doctor)
    add_otlp_option(doctor)
    _add_script(doctor, required=False)
    doctor.set_defaults(func=_cmd_doctor)

    check = sub.add_parser("check", help="is it reproducible? run K times (or against eager) and explain")
    check.add_argument("--runs", type=_runs, metavar="K", help="runs of the script as written (default 2)")
    check.add_argument("--seed", type=options.seed,
                       help="seed everything (and PYTHONHASHSEED) from this root in every run")
    check.add_argument("--against", choices=("eager", "fallback-random"),
                       help="compare with compilation disabled, or with inductor's fallback_random=True")
    check.add_argument("--out", type=options.directory, metavar="DIR",
                       help="where the runs and report go (default torchrepro-runs/...)")
    options.add_outputs(check)
    check.add_argument("--no-localize", action="store_true", help="skip the op-level replay of the divergent step")
    check.add_argument("--fixes", action="store_true",
                       help="after any divergence, try the candidate fixes (default: when the cause is one a fix "
                            "can address)")
    check.add_argument("--only-fixes", metavar="NAMES",
                       help="try only these fixes (comma list of threads_1, deterministic, fallback_random, "
                            "aot_eager, eager)")
    check.add_argument("--no-fixes", action="store_true", help="do not run the fix ladder")
    _add_ranks(check)
    add_otlp_option(check)
    _add_tolerance(check)
    _add_script(check)
    check.set_defaults(func=_cmd_check)

    resume = sub.add_parser("check-resume", help="stop after step K, resume in a fresh process: bit-exact?")
    resume.add_argument("--at", type=options.positive_int, required=True, metavar="K",
                        help="stop after step K and resume from there")
    resume.add_argument("--seed", type=options.seed,
                        help="seed everything (and PYTHONHASHSEED) from this root in every run")
    resume.add_argument("--out", type=options.directory, metavar="DIR", help="where the runs, checkpoint and report go")
    options.add_outputs(resume)
    _add_ranks(resume)
    add_otlp_option(resume)
    _add_script(resume)
    resume.set_defaults(func=_cmd_check_resume)

    diff = sub.add_parser("diff", help="compare two stored runs")
    diff.add_argument("run_a", metavar="RUN_A")
    diff.add_argument("run_b", metavar="RUN_B")
    options.add_outputs(diff)
    _add_html(diff)
    _add_tolerance(diff)
    diff.set_defaults(func=_cmd_diff)

    report = sub.add_parser("report", help="re-render a stored run")
    report.add_argument("run_dir", metavar="RUN_DIR")
    options.add_outputs(report, junit=True)
    _add_strict(report)
    _add_html(report)
    add_otlp_option(report)
    report.set_defaults(func=_cmd_report)

    run = sub.add_parser("run", help="run a script with capture in this process (what each torchrun rank runs)")
    run.add_argument("--out", type=options.directory, metavar="RUN_DIR", help="run directory shared by all ranks")
    run.add_argument("--seed", type=options.seed, help="seed everything from this root before the script starts")
    run.add_argument("--fingerprint-every", type=options.positive_int, metavar="N")
    run.add_argument("--grads", action="store_true", help="also fingerprint gradients before each step")
    run.add_argument("--compile-mode", choices=("eager", "fallback-random"),
                     help="run compiled code eagerly, or with inductor's fallback_random")
    run.add_argument("--snapshots", action="store_true",
                     help="save parameter values (rank-<r>/snapshots) at steps 0-15, powers of two and the last")
    run.add_argument("--replay-step", type=options.count, metavar="K", help="record every op of step K, then exit")
    run.add_argument("--replay-out", metavar="FILE", help="where --replay-step writes its op trace")
    run.add_argument("--replay-graphs", action="store_true",
                     help="with --replay-step: compare each inductor graph with its eager FX graph instead")
    run.add_argument("--replay-kernels", action="store_true",
                     help="with --replay-step: repeat each inductor graph (forward and backward) on identical inputs")
    run.add_argument("--stop-after-step", type=int, metavar="K", help="end the script cleanly after step K")
    run.add_argument("--fix", metavar="NAME", help="apply a candidate fix first (threads_1, deterministic, "
                                                   "fallback_random, aot_eager[:FRAMES])")
    add_otlp_option(run, in_process=True)
    _add_script(run)
    run.set_defaults(func=_cmd_run)

    from .cache.cli import add_parser as add_cache_parser
    from .commands.watch import add_parser as add_watch_parser

    add_cache_parser(sub)
    add_watch_parser(sub)
    from .commands import drift as drift_command

    drift_command.add_parser(sub)

    env = sub.add_parser("env", help="versions, determinism switches, caches and risky settings")
    env.add_argument("--json", action="store_true", help="print machine-readable JSON")
    env.set_defaults(func=_cmd_env)
    return parser


def _tolerant_streams() -> None:
    """A terminal or pipe that cannot encode some character (PYTHONIOENCODING=ascii) gets an escape, not an error."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def _check_torch_logs() -> None:
    """An invalid TORCH_LOGS makes ``import torch`` fail: say so before anything is created."""
    value = os.environ.get("TORCH_LOGS")
    if not value:
        return
    try:
        import torch  # noqa: F401
    except ValueError as exc:
        why = " ".join(str(exc).split("For more info")[0].split())
        raise UserError(f"TORCH_LOGS={value!r}: {why} (TORCH_LOGS=help lists them)") from None


def main(argv: list[str] | None = None) -> int:
    _tolerant_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "args", None) and args.args[0] == "--":
        args.args = args.args[1:]
    try:
        _check_outputs(args)
        _check_torch_logs()
        return run_with_export(args, args.func)
    except UserError as exc:
        print(f"torchrepro: error: {visible(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("torchrepro: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
