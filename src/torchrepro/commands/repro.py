"""``torchrepro repro RUN_DIR [--graph ID] [--out DIR] [--bisect]``: a standalone reproducer of one
compiled graph of a run.

Every run of ``check`` (and ``doctor --probe``, ``run --probe-repeats K``) saves each compiled graph
it probed under ``rank-<r>/graphs/<compile id>-<graph>/`` (:mod:`torchrepro.capture.graph_probe`):
its FX code, its first call's inputs and what the probe found. This command copies one of them
into ``DIR`` with ``repro.py`` (:mod:`torchrepro.capture.repro_script`), which re-runs that graph compiled, K times
bit for bit and against eager, with neither the training script nor torchrepro installed.
``--bisect`` asks torch's compiler bisector which backend, subsystem or pass makes the compiled
graph differ from eager (:mod:`torchrepro.capture.graph_bisect`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from . import options
from ..errors import InputError
from ..eventlog.rundir import refuse_while_written
from ..render.sanitize import visible
from ..reports.check_report import Evidence
from .workdir import COPY_DIR

GRAPH_FILES = ("graph.py", "inputs.json", "meta.json", "inputs.safetensors", "inputs.pt")
META = "meta.json"


def add_parser(sub: Any) -> None:
    """Register ``repro``."""
    p = sub.add_parser(
        "repro", help="write a standalone script that re-runs one compiled graph of a run and shows its divergence"
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, or a check's output directory")
    p.add_argument(
        "--graph",
        metavar="ID",
        help="which compiled graph: COMPILE_ID/GRAPH (0/0/backward); default the one a check's verdict names, "
        "else the first that differed when probed",
    )
    p.add_argument("--out", type=options.directory, metavar="DIR", help="where to write it (default RUN_DIR/repro)")
    p.add_argument(
        "--bisect",
        action="store_true",
        help="also find the backend, subsystem or pass that makes the compiled graph differ from eager",
    )
    p.set_defaults(func=run)


def saved_graphs(run_dir: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """Every compiled graph saved in the ranks of ``run_dir`` (a run: ``rank-*/graphs``), or of its
    runs (a check's: ``*/rank-*/graphs``, but never in a copy of the working directory a run
    started in, ``cwd/``): its id (``0/0/backward``), folder and probe record, those that differed first."""
    found = []
    pattern = "rank-*/graphs/*/" + META
    runs = [
        run_dir,
        *(d for d in sorted(run_dir.iterdir()) if d.name != COPY_DIR and d.is_dir() and not d.is_symlink()),
    ]
    for meta_file in sorted(f for run in runs for f in run.glob(pattern)):
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("compile_id"), str):
            found.append((f"{meta['compile_id']}/{meta.get('graph')}", meta_file.parent, meta))
    return sorted(found, key=lambda g: not g[2].get("differing"))


def verdict_graph(run_dir: Path) -> Evidence | None:
    """The evidence of a check's verdict (``RUN_DIR/report.json``, read as the typed report) where it
    names a compiled graph (its ``compile_id``, ``graph``, the ``run`` it is saved in and the ``op``
    where it departs); None where the directory holds no check report, or its verdict names none."""
    from ..eventlog.rundir import REPORT_FILE, read_json_file
    from ..reports.check_report import CheckReport
    from ..reports.loader import load_report, report_kind

    path = run_dir / REPORT_FILE
    if not path.is_file():
        return None
    try:
        data = read_json_file(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from None
    if report_kind(data) != "check":
        return None
    report = load_report(data, str(path))
    first = report.determinism.first_divergence if isinstance(report, CheckReport) else None
    if first is None or not first.evidence.compile_id or not first.evidence.graph:
        return None
    return first.evidence


def choose(run_dir: Path, wanted: str | None) -> tuple[str, Path, dict[str, Any]]:
    """The graph ``--graph`` names; else the one the check's verdict names (:func:`verdict_graph`,
    saved in the run it names where several runs saved it), else the first that differed when
    probed, else the only one."""
    graphs = saved_graphs(run_dir)
    if not graphs:
        raise InputError(
            f"{run_dir} holds no saved compiled graph (rank-*/graphs/): graphs are saved by torchrepro check, "
            "doctor --probe and run --probe-repeats K of a script compiled with inductor"
        )
    ids = sorted({g[0] for g in graphs})
    if wanted is None:
        named = verdict_graph(run_dir)
        if named is not None:
            graph_id, run = f"{named.compile_id}/{named.graph}", named.run
            match = [g for g in graphs if g[0] == graph_id]
            if not match:
                raise InputError(
                    f"the check's verdict names compiled graph {graph_id}, which {run_dir} holds no saved copy of "
                    f"(too large to save, or its run removed): choose one with --graph ({', '.join(ids)})"
                )
            return min(match, key=lambda g: g[1].relative_to(run_dir).parts[0] != run)
        if graphs[0][2].get("differing") or len(ids) == 1:
            return graphs[0]
        raise InputError(f"no probed graph differed: choose one with --graph ({', '.join(ids)})")
    match = [g for g in graphs if g[0] == wanted.strip("/")]
    if not match:
        raise InputError(f"--graph {wanted}: no such graph in {run_dir} (saved: {', '.join(ids)})")
    return match[0]


def _script_source() -> str:
    """The text of :mod:`torchrepro.capture.repro_script` (read, not imported: importing it imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec("torchrepro.capture.repro_script")
    if spec is None or spec.origin is None:
        raise InputError("this torchrepro installation lacks capture/repro_script.py")
    return Path(spec.origin).read_text(encoding="utf-8")


def write_repro(source: Path, out: Path) -> Path:
    """Copy the saved graph in ``source`` to ``out`` with its ``repro.py``; the script's path."""
    out.mkdir(parents=True, exist_ok=True)
    for name in GRAPH_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, out / name)
    script = out / "repro.py"
    script.write_text(_script_source(), encoding="utf-8")
    return script


def run(args: argparse.Namespace) -> int:
    """Write the reproducer (and with ``--bisect``, bisect it); 0, or 1 when the bisection named a cause."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such directory")
    refuse_while_written(run_dir)
    graph_id, source, meta = choose(run_dir, args.graph)
    out = Path(args.out) if args.out else run_dir / "repro"
    if out.resolve() == source.resolve():
        raise InputError(f"--out {out} is where the graph is saved: choose another directory")
    script = write_repro(source, out)
    probe = (
        f"{meta.get('runs_differing')} of {meta.get('repeats')} repeats differed when probed"
        if meta.get("repeats")
        else "not probed"
    )
    print(visible(f"compiled graph {graph_id} ({probe}): {script}"))
    print(visible(f"  run it: python {script}   (needs torch only; exit 1 when the divergence reproduces)"))
    if not args.bisect:
        return 0
    if meta.get("differing"):  # a test that passes and fails by chance cannot be bisected
        print(visible(f"compiled graph {graph_id} differs from itself run to run ({probe}): not bisected"))
        return 0
    from ..capture.graph_bisect import bisect

    found = bisect(out)
    print(visible(f"bisect: {found}"))
    if (differs := apart_from_verdict(run_dir, graph_id, found)) is not None:
        print(visible(f"  {differs}"))
    return 0


def apart_from_verdict(run_dir: Path, graph_id: str, found: str) -> str | None:
    """Why the bisection of ``graph_id`` (``found``) and the check's verdict name different things, in a
    line; None where they agree (the bisector names the op the verdict does) or no verdict names an op."""
    named = verdict_graph(run_dir)
    if named is None or not named.op:
        return None
    named_id = f"{named.compile_id}/{named.graph}"
    if named_id != graph_id:
        return f"the check's verdict names compiled graph {named_id}, not this one (--graph chose it)"
    op = named.op.split(" ", 1)[0]
    base = op.removeprefix("aten.").split(".", 1)[0]
    if "matches eager" in found:
        return (
            f"the check's verdict names op {op}, where this graph departed from eager in the run; compiled afresh "
            "on its saved inputs it matches eager: what differed depends on how the run compiled it"
        )
    if base in found:
        return None
    return (
        f"the check's verdict names op {op}, where the graph's outputs first depart from eager in its order; the "
        "bisector names the first compiler step without which the graph matches eager, which can change a later op"
    )
