"""What a captured run is told to do, typed once: :class:`RunOptions`.

A command that launches runs (``doctor``, ``check``, ``check-resume``, ``drift``) builds one
``RunOptions`` per run from its parsed flags and hands it to the child in one environment variable
(:data:`OPTIONS_VAR`, JSON); the child (``torchrepro run``, each rank under torchrun, and the ranks
capture follows into) reads it back once, with no flags re-parsed. A user who calls ``torchrepro run
[options] SCRIPT`` directly gets the same ``RunOptions`` from those flags. Values are checked when
the flags are parsed (:mod:`torchrepro.commands.options`), not here. Importing this module does not import torch.

>>> RunOptions.from_json(RunOptions(seed=3, grads=True).to_json()) == RunOptions(seed=3, grads=True)
True
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, MutableMapping

from ..errors import InputError

if TYPE_CHECKING:
    from ..capture.session import CaptureConfig

OPTIONS_VAR = "TORCHREPRO_RUN_OPTIONS"
PROBE_REPEATS = 8  # check's default: each compiled graph called again this many times (capture.graph_probe)
_PATHS = ("run_dir", "replay_out")


@dataclass(frozen=True)
class RunOptions:
    """Everything a captured child run needs: where it writes, how it is set up before the script
    starts (cache, compile mode, fix, seeds, drift factors) and what capture records."""

    run_dir: Path | None = None  # None: ``torchrepro run`` picks one every rank agrees on
    seed: int | None = None  # seed everything from this root before the script starts
    compile_mode: str | None = None  # None (as written) | "eager" | "fallback-random"
    fingerprint_every: int | None = None  # None: every step when that costs < 1 %
    grads: bool = False  # also fingerprint gradients
    snapshots: bool = False  # parameter sketches at steps 0-15, powers of two and the last; the first and last whole
    whole_snapshots: bool = False  # with snapshots: every snapshot step's parameters whole (compare's tensors)
    replay_step: int | None = None  # record every op of this step (capture.ops), then exit
    replay_out: Path | None = None  # where the replay goes (default rank-<r>/replay.json)
    replay_graphs: bool = False  # compare compiled graphs with their eager FX graphs instead of ops
    replay_kernels: bool = False  # repeat each compiled graph on identical inputs instead
    probe_repeats: int = 0  # call each compiled graph again this many times after its first step (capture.graph_probe)
    probe_against_eager: bool = False  # the probe also runs each graph's FX graph eagerly (check --against)
    stop_after_step: int | None = None  # end the script cleanly (exit 0) after this step
    fix: str | None = None  # a candidate fix applied first (capture.fixes.apply_fix)
    factors: dict[str, int | str] | None = None  # a drift run's factor levels (torchrepro.runtime.factors.apply)
    cache_policy: str | None = None  # --cache-policy: per-node | shared | per-rank
    cache_root: str | None = None  # --cache-root (absolute)
    warm_from: str | None = None  # --warm-from: a cache pack to unpack first (absolute)
    allow_unsigned: bool = False  # --allow-unsigned: --warm-from accepts a pack no trusted key signed
    warm_start_skipped: str | None = None  # why the command kept its --warm-from pack from the run (run.json says it)
    analysis_only: bool = False  # a run of check/drift: its last garbage collections skipped at exit (prepare)
    ranks_only: bool = False  # doctor: RNG and batch digests only in a run of several ranks (capture.steps.StepConfig)
    module: str | None = (
        None  # -m MODULE: run it as python -m does, from the working directory (the script is its file)
    )

    @property
    def warm_start_meta(self) -> dict[str, str]:
        """What run.json and a report's meta say of a ``--warm-from`` pack kept from the runs (empty: none)."""
        return {"warm_start_skipped": self.warm_start_skipped} if self.warm_start_skipped else {}

    def to_json(self) -> str:
        """One line of JSON (paths as strings)."""
        data = asdict(self)
        for name in _PATHS:
            if data[name] is not None:
                data[name] = str(data[name])
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunOptions:
        """The options :meth:`to_json` wrote; :class:`InputError` for anything else."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            for name in _PATHS:
                if data.get(name) is not None:
                    data[name] = Path(data[name])
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise InputError(f"{OPTIONS_VAR}: not torchrepro run options ({exc})") from None

    def env(self) -> dict[str, str]:
        """The environment variable that hands these options to a child process."""
        return {OPTIONS_VAR: self.to_json()}

    @classmethod
    def from_env(cls, environ: MutableMapping[str, str] | None = None) -> RunOptions | None:
        """The options a launching torchrepro handed this process (None: none), removed from the
        environment so that the script's own subprocesses do not inherit them."""
        text = (os.environ if environ is None else environ).pop(OPTIONS_VAR, None)
        return None if text is None else cls.from_json(text)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **values: Any) -> RunOptions:
        """The options parsed flags give: each field a flag of that name sets (``--seed``,
        ``--cache-policy`` ...), paths made absolute; ``values`` set the rest."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
        for name in ("cache_root", "warm_from"):
            if name in given:
                given[name] = str(Path(given[name]).resolve())
        for name in _PATHS:
            if name in given:
                given[name] = Path(given[name])
        return cls(**given, **values)

    def capture_config(self) -> CaptureConfig:
        """What capture records for a run with these options (``run_dir`` is set)."""
        from ..capture.session import CaptureConfig
        from ..capture.steps import StepConfig

        return CaptureConfig(
            run_dir=Path(self.run_dir or "."),
            seed=self.seed,
            compile_mode=self.compile_mode,
            steps=StepConfig(
                fingerprint_every=self.fingerprint_every,
                grads=self.grads,
                snapshots=self.snapshots,
                whole_snapshots=self.whole_snapshots,
                ranks_only=self.ranks_only,
            ),
            replay_step=self.replay_step,
            replay_out=self.replay_out,
            replay_graphs=self.replay_graphs,
            replay_kernels=self.replay_kernels,
            probe_repeats=self.probe_repeats,
            probe_against_eager=self.probe_against_eager,
            stop_after_step=self.stop_after_step,
        )

    def absolute(self) -> RunOptions:
        """These options with the run directory and the replay file absolute (for a rank that capture
        follows into, :mod:`torchrepro.runtime.follow`, which may start in another working directory)."""
        return replace(
            self,
            run_dir=Path(self.run_dir).resolve() if self.run_dir else None,
            replay_out=Path(self.replay_out).resolve() if self.replay_out else None,
        )
