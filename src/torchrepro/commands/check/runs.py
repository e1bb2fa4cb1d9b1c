"""The runs of one ``check``: :class:`RunSpec` (a run's label and compile mode) and
:class:`Checker`, which launches each run and each replay of a divergent step and reads them back.
Used by :mod:`torchrepro.commands.check.comparison` and the fix ladder (:mod:`torchrepro.commands.check.fix_ladder`)."""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from ...analysis.divergence import settings
from ...analysis.verdict import Ending, ending
from ...errors import InputError, NotStarted, Stopped
from ..launcher import ChildResult, child_env, launch, sharing_cores_env, side_by_side
from ..workdir import Ledger, fresh_workdir, why_shared
from ...runtime.run_options import RunOptions
from ...eventlog.events import Step
from ...eventlog.payloads import JsonObject
from ...render.progress import Progress
from ...eventlog.rundir import RUN_FILE, Run, load_run, replay_file, supervisor_record, usable_cores, write_json


@dataclass
class RunSpec:
    """One run of a check: its label (folder name) and how compilation is configured."""

    label: str
    compile_mode: str | None  # None: as written; "eager"; "fallback-random"
    title: str


def plan_runs(runs: int, against: str | None) -> list[RunSpec]:
    if against is None:
        return [RunSpec(f"run-{i + 1}", None, f"run {i + 1} (as written)") for i in range(runs)]
    reference = RunSpec(against, against, "compilation disabled" if against == "eager" else "fallback_random=True")
    return [reference, RunSpec("compiled", None, "as written")]


SIDE_BY_SIDE_VAR = "TORCHREPRO_CHECK_SIDE_BY_SIDE"  # 0: one run after the other; 1: side by side


def side_by_side_allowed(processes: int) -> bool:
    """Whether a check may run its runs at once (``processes`` in all): ``TORCHREPRO_CHECK_SIDE_BY_SIDE``
    decides if set; else when there is a core for each process and no accelerator device is visible
    (runs sharing one GPU could run out of its memory, which alone they would not)."""
    said = os.environ.get(SIDE_BY_SIDE_VAR)
    if said in ("0", "1"):
        return said == "1"
    return processes <= usable_cores() and not accelerator_visible()


def intra_op_threads(runs: list[Run]) -> int:
    """The most intra-op threads a rank of ``runs`` ran with (recorded after its first step; 1 when not recorded)."""
    recorded = [settings(log).get("num_threads") for r in runs for log in r.logs]
    return max([n for n in recorded if isinstance(n, int) and n > 0], default=1)


def accelerator_visible() -> bool:
    """A GPU device file (NVIDIA, AMD) this process could use, unless ``CUDA_VISIBLE_DEVICES`` hides them all."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/dev/kfd").exists()


class Checker:
    """Runs, compares and explains; one instance per ``check`` invocation."""

    def __init__(
        self,
        script: Path,
        args: list[str],
        run_dir: Path,
        *,
        options: RunOptions,
        snapshots: bool,
        console: Console,
        nproc: int = 1,
        timeout: float | None = None,
    ):
        """``options``: what every run starts from (the seed, the cache policy)."""
        self.script, self.args, self.run_dir, self.nproc, self.timeout = script, args, run_dir, nproc, timeout
        # every run and replay is made only to compare: it ends without the last collections (prepare)
        self.options, self.seed, self.snapshots = replace(options, analysis_only=True), options.seed, snapshots
        self.console = console
        self.timings: dict[str, float] = {}
        self.endings: dict[str, Ending] = {}
        self.replay_failures: dict[str, str] = {}  # replay tag -> why it wrote no record
        self.side_by_side = False  # whether run_all ran its runs at once
        self.workdirs = Ledger()  # each run and replay in a fresh copy of the working directory
        self.progress = Progress(console)  # each run's and replay's step and time while it runs
        self.steps_seen: int | None = None  # the steps of a full run as written, once one ended

    def run_all(self, specs: list[RunSpec]) -> list[tuple[Run, int]]:
        """:meth:`run` of each of ``specs``: side by side where :func:`side_by_side_allowed` says
        the machine has room and each run has its own copy of the working directory, else one
        after the other."""
        self.side_by_side = (
            len(specs) > 1
            and side_by_side_allowed(len(specs) * self.nproc)
            and why_shared(self.args, [self.run_dir]) is None  # runs in one directory: one after the other
        )
        if self.side_by_side:
            self.console.print(f"[dim]· {len(specs)} runs side by side[/]", highlight=False)
            return side_by_side([partial(self.run, spec, sharing_cores_env()) for spec in specs])
        return [self.run(spec) for spec in specs]

    def shared_cores_note(self, runs: list[Run]) -> str | None:
        """What to say of runs that agree when :meth:`run_all` ran them side by side with more
        threads than cores: a race between a run's own threads needs them running at once, which
        sharing the cores makes rarer (docs/evidence/performance.md, "check: its runs side by side")."""
        threads, cores = intra_op_threads(runs), usable_cores()
        if not self.side_by_side or threads * len(runs) * self.nproc <= cores:
            return None
        return (
            f"the runs ran side by side, {threads} intra-op threads each on {cores} cores: a race between a run's "
            f"own threads shows less often than in a run alone; {SIDE_BY_SIDE_VAR}=0 runs them one after the other"
        )

    def run(
        self, spec: RunSpec, env: dict[str, str] | None = None, timeout: float | None = None, **options: Any
    ) -> tuple[Run, int]:
        """Launch ``spec`` (``env``: set in its environment, and said in its ``run.json``) and read it back."""
        run_dir = self.run_dir / spec.label
        self.console.print(f"[dim]· {spec.label}: {spec.title}…[/]", highlight=False)
        meta: JsonObject = {
            "label": spec.label,
            "compile_mode": spec.compile_mode,
            "seed": self.seed,
            "script": str(self.script),
            "args": self.args,
            "supervisor": supervisor_record(),  # with no "ended" once it is gone: the run was interrupted
            **({"env_set": env} if env else {}),
        }
        write_json(run_dir / RUN_FILE, meta)
        t0 = time.perf_counter()
        stop = options.get("stop_after_step")
        total = stop + 1 if isinstance(stop, int) else self.steps_seen
        with (
            fresh_workdir(run_dir, self.script, self.args, spec.label, self.workdirs, skip=[self.run_dir]) as where,
            self.progress.phase(spec.label, run_dir, total),
        ):
            result = launch(
                run_dir,
                where.script,
                self.args,
                replace(
                    self.options,
                    fingerprint_every=1,
                    grads=True,
                    compile_mode=spec.compile_mode,
                    snapshots=self.snapshots,
                    **options,
                ),
                nproc=self.nproc,
                quiet=True,
                env=child_env(self.seed, env),
                stall_timeout=timeout or self.timeout,
                cwd=where.cwd,
            )
        self.timings[spec.label] = round(time.perf_counter() - t0, 3)
        meta.update(
            workdir=where.record(),
            ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            exit_code=result.exit_code,
            stderr_tail=result.stderr_tail,
            rank_exit_codes={str(r): c for r, c in result.rank_exit_codes.items()},
            stalled_after_s=result.stalled_after_s,
            not_started_within_s=result.not_started_within_s,
            wall_s=self.timings[spec.label],
            stopped_by=result.stopped_by,
        )
        write_json(run_dir / RUN_FILE, meta)
        self._stopped(result, spec.label)
        if result.not_started_within_s is not None:  # said when it was ended, whatever a rank began to write then
            raise NotStarted(timeout or self.timeout or result.not_started_within_s, f"{spec.label}: ")
        if not any(run_dir.glob("rank-*/events.jsonl")):
            raise InputError(
                f"{spec.label}: the script exited ({result.exit_code}) before capture started: "
                + "; ".join(result.stderr_tail[-3:])
            )
        self.console.print(
            f"[dim]  done in {self.timings[spec.label]:.1f} s, exit {result.exit_code}[/]", highlight=False
        )
        run = load_run(run_dir)
        self.endings[spec.label] = ending(spec.label, run.meta, run.logs)
        if stop is None and spec.compile_mode is None and run.logs:
            self.steps_seen = max(self.steps_seen or 0, len(run.logs[0].of(Step)))
        return run, result.exit_code

    def _stopped(self, result: ChildResult, what: str) -> None:
        """A signal to torchrepro stopped the job: the check ends here (exit 128 + N)."""
        if result.stopped_by:
            raise Stopped(
                f"{what}: stopped by {result.stopped_by}; the runs so far are in {self.run_dir}", result.stopped_by
            )

    def replay(
        self,
        spec: RunSpec,
        step: int,
        tag: str,
        eager: bool = False,
        graphs: bool = False,
        rank: int = 0,
        kernels: bool = False,
    ) -> JsonObject | None:
        """Rerun ``spec`` up to ``step`` and record that step on ``rank``: every op, every compiled
        graph against eager (``graphs``), or every compiled graph repeated on identical inputs
        (``kernels``). The record as the replay wrote it (``step``, and ``ops``, ``graphs`` or ``kernels``:
        :mod:`torchrepro.capture.ops`), or None when it wrote none."""
        replay_out = self.run_dir / "replays" / f"{tag}.json"
        mode = "eager" if eager else spec.compile_mode
        what = (
            "compiled graphs repeated on identical inputs"
            if kernels
            else "compiled graphs against eager"
            if graphs
            else "op capture"
        )
        self.console.print(
            f"[dim]· replaying step {step} of {spec.label}{' eagerly' if eager else ''} with {what} ({tag})…[/]",
            highlight=False,
        )
        t0 = time.perf_counter()
        replay_dir = self.run_dir / "replays" / tag
        with (
            fresh_workdir(
                replay_dir, self.script, self.args, f"replay {tag}", self.workdirs, skip=[self.run_dir]
            ) as where,
            self.progress.phase(f"replay {tag}", replay_dir, step + 1),
        ):
            result = launch(
                replay_dir,
                where.script,
                self.args,
                replace(
                    self.options,
                    fingerprint_every=1,
                    compile_mode=mode,
                    replay_step=step,
                    replay_out=replay_out,
                    replay_graphs=graphs,
                    replay_kernels=kernels,
                ),
                nproc=self.nproc,
                env=child_env(self.seed),
                quiet=True,
                stall_timeout=self.timeout,
                cwd=where.cwd,
            )
        self._stopped(result, f"replay {tag}")
        self.timings[f"replay {tag}"] = round(time.perf_counter() - t0, 3)
        replay_out = replay_file(replay_out, rank)  # the world may be one the script started (mp.spawn, Lightning)
        if replay_out.exists():
            record: JsonObject = json.loads(replay_out.read_text())
            return record
        self.replay_failures[tag] = _why_no_record(result, step, rank)
        return None


_RANK_PREFIX = re.compile(r"^(\[\w+\]:)+")  # what torchrun and torch put before a rank's lines: [default0]:[rank0]:


def _why_no_record(result: ChildResult, step: int, rank: int = 0) -> str:
    """Why a replay wrote no record: the exception that ended it (its first line; under torchrun
    the replayed rank's own, not the launcher's ChildFailedError), or that it ended cleanly before
    reaching ``step``."""
    if result.exit_code == 0:
        return f"the replay ended (exit 0) before step {step}"
    for lines in (result.rank_stderr_tails.get(rank, []), result.stderr_tail):
        errors = [
            text
            for text in (_RANK_PREFIX.sub("", line).strip() for line in lines)
            if re.match(r"[\w.]*(Error|Exception|Failed|Failure|Interrupt)\b", text) and "ChildFailedError" not in text
        ]
        if errors:
            return f"the replay exited with {result.exit_code}: {errors[-1]}"
    last = next((line.strip() for line in reversed(result.stderr_tail) if line.strip()), "")
    return f"the replay exited with {result.exit_code}" + (f": {last}" if last else "")
