"""``torchrepro golden check``: run a script again as its golden run was recorded and judge the new
run against it (:mod:`torchrepro.analysis.golden_verdict`): bit for bit with ``diff``'s comparison
(:func:`torchrepro.commands.check.comparison.diff`), and where the two differ, against the golden's
run-to-run band with ``compare``'s rules (:func:`torchrepro.analysis.equivalence.judge`). What can
be decided before anything runs (another torch without a band, another number of ranks) is decided
then: NOT COMPARABLE, and nothing is run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from ...analysis.divergence import Divergence
from ...analysis.equivalence import Config, judge
from ...analysis.golden_verdict import (
    NOT_RUN,
    comparable,
    device_of,
    differences,
    environment_of,
    golden_findings,
    golden_verdict,
    still_possible,
)
from ...analysis.nondeterminism import Decision, not_localised
from ...analysis.verdict import ending
from ...errors import UserError
from ...eventlog.golden_dir import REFERENCE, SECOND, GoldenEnvironment, load_golden_runs, read_manifest
from ...eventlog.payloads import JsonObject
from ...eventlog.rundir import create_run_dir, default_run_dir
from ...host.files import dist_version
from ...render.save import write_report
from ...reports.check_report import Evidence
from ...reports.golden_report import GoldenReport
from ...runtime.run_options import RunOptions
from ..check.comparison import diff, localize as replay_ops
from ..check.runs import Checker, RunSpec
from ..launcher import validate_script
from .record import script_sha256

RUN = "run"  # the new run's folder in the check's directory


def check_golden(
    golden: Path,
    script: Path,
    args: list[str],
    *,
    options: RunOptions,
    run_dir: Path | None = None,
    nproc: int | None = None,
    timeout: float | None = None,
    localize: bool = True,
    console: Console | None = None,
) -> tuple[GoldenReport, Path | None]:
    """Judge a new run of ``script`` with ``args`` against the golden directory ``golden``: the
    report (also written to ``run_dir/report.json``) and the directory the run was stored in (None
    when it was not comparable before anything ran). ``options``' seed is the golden's (as recorded);
    ``nproc``: the ranks to launch (default: as recorded). ``localize``: where the run differs from the
    golden though neither the script, its arguments nor the environment changed, replay the
    divergent step twice with op capture, as ``check`` does, to name the op."""
    manifest = read_manifest(golden)
    references = load_golden_runs(golden, manifest)
    script = validate_script(script)
    has_band = SECOND in manifest["runs"]
    recorded = environment_of(manifest)
    nproc = nproc or manifest["nproc"]
    before: GoldenEnvironment = {
        "torch_version": dist_version("torch"),
        "device": NOT_RUN,
        "world_size": manifest["world_size"] if nproc == manifest["nproc"] else nproc,
    }
    found = differences(recorded, before)
    findings = golden_findings(manifest, script_sha256(script), args, found)
    if not comparable(found, has_band):  # decided before anything runs
        possible = still_possible(found, has_band, manifest)
        verdict, line = golden_verdict(str(golden), found, possible, has_band, None, None)
        report = GoldenReport(str(golden), verdict, line, recorded, before, found, possible, findings)
        return report, None
    run_dir = create_run_dir(run_dir or default_run_dir(script, label="golden"))
    checker = Checker(
        script,
        args,
        run_dir,
        options=replace(options, seed=manifest["seed"]),
        snapshots=any(golden.glob(f"{REFERENCE}/rank-*/snapshots/*.npz")),
        console=console or Console(stderr=True),
        nproc=nproc,
        timeout=timeout,
    )
    spec = RunSpec(RUN, None, f"as written, against the golden run in {golden}")
    run, _ = checker.run(spec)
    header = run.logs[0].header if run.logs else None
    here: GoldenEnvironment = {
        "torch_version": header.torch_version if header else before["torch_version"],
        "device": device_of(header),
        "world_size": len(run.logs),
    }
    found = differences(recorded, here)
    possible = still_possible(found, has_band, manifest)
    check = diff(golden / REFERENCE, run_dir / RUN)
    band: JsonObject | None = None
    if has_band and check.determinism.first_divergence is not None and comparable(found, has_band):
        first, second = references
        band = judge(
            Config("a-1", first.logs, ending(REFERENCE, first.meta, first.logs)),
            Config("a-2", second.logs, ending(SECOND, second.meta, second.logs)),
            Config("b", run.logs, checker.endings[RUN]),
        )
    unchanged = not found and script_sha256(script) == manifest["script_sha256"] and args == manifest["args"]
    within = band is not None and band["verdict"] == "equivalent"
    if check.determinism.first_divergence is not None and not within and unchanged and localize:
        check = diff(golden / REFERENCE, run_dir / RUN, explain=_replays(checker, spec))  # where it diverged, by replay
    verdict, line = golden_verdict(str(golden), found, possible, has_band, check, band)
    report = GoldenReport(
        str(golden),
        verdict,
        line,
        recorded,
        here,
        found,
        possible,
        golden_findings(manifest, script_sha256(script), args, found),
        notes=[f"the golden's own runs: {manifest['run_to_run']}"] if manifest["run_to_run"] else [],
        run_dir=str(run_dir),
        check=check,
        band=band,
    )
    write_report(run_dir, report)
    return report, run_dir


def _replays(checker: Checker, spec: RunSpec) -> Callable[[Divergence, str], Decision | None]:
    """How ``diff`` explains a divergence from the golden that its logs leave open: the divergent
    step of this run replayed twice, eagerly, with op capture (``check``'s op replays). Replays that differ
    name the op that does not repeat itself; replays that agree say so: the difference is then in
    compiled code or in something that changed since the golden was recorded."""

    def explain(div: Divergence, cause: str) -> Decision | None:
        if cause not in ("unknown", "numerics", "init_params"):
            return None
        try:
            found, evidence = replay_ops(checker, spec, spec, div, cause)
        except UserError:
            raise
        except Exception as exc:  # the localisation's own failure: said, and the cause kept
            return cause, not_localised(cause, f"the op replays: {type(exc).__name__}: {exc}".splitlines()[0])
        if str(evidence.localisation or "").startswith("inside compiled code"):
            return cause, Evidence(
                localisation=f"two eager replays of step {div.step} agree: the difference from the golden run is "
                "in compiled code (torchrepro check localises it) or in something that changed since the golden "
                "was recorded (a dependency, a data file, a setting)"
            )
        return found, evidence

    return explain
