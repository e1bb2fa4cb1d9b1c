"""``torchrepro repro RUN_DIR [--graph ID] [--out DIR] [--force] [--bisect [--trust-run-dir] [--import M]]``: a
standalone reproducer of one compiled graph of a run.

Every run of ``check`` (and ``doctor --probe``, ``run --probe-repeats K``) saves each compiled graph
it probed under ``rank-<r>/graphs/<compile id>-<graph>/`` (:mod:`torchrepro.capture.graph_probe`):
its FX code, its first call's inputs and what the probe found. This command checks one of them
(every file a regular file under its cap, every declared shape and dtype against the bytes stored
and a memory budget: :func:`torchrepro.capture.repro_script.parse`) and copies it into ``DIR``
with ``repro.py`` (:mod:`torchrepro.capture.repro_script`), which re-runs that graph compiled, K
times bit for bit and against eager, with neither the training script nor torchrepro installed.
Every file is created fresh (:func:`torchrepro.eventlog.output_guard.output_folder`).

``graph.py`` is the run's code: this command never runs it. ``repro.py`` runs it, and so does
``--bisect``, which asks torch's compiler bisector which backend, subsystem or pass makes the
compiled graph differ from eager (:mod:`torchrepro.capture.graph_bisect`) in a process of its own;
for a run directory another user made it needs ``--trust-run-dir`` (docs/commands.md, "Run
directories from others").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import options
from ..errors import InputError, Stopped
from ..render.sanitize import visible
from ..reports.check_report import Evidence

if TYPE_CHECKING:
    from ..capture.repro_script import Saved

META = "meta.json"
SCRIPT = "repro.py"
# where graphs are saved: a run's rank folders, or those of a check's runs one level down
GRAPH_FOLDERS = ("rank-*/graphs/*", "*/rank-*/graphs/*")


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
    p.add_argument("--force", action="store_true", help="replace the files of an earlier reproducer in DIR")
    p.add_argument(
        "--bisect",
        action="store_true",
        help="also find the backend, subsystem or pass that makes the compiled graph differ from eager "
        "(runs the run's graph.py, in a process of its own)",
    )
    p.add_argument(
        "--trust-run-dir",
        action="store_true",
        help="let --bisect run the graph.py of a run directory another user made (or others may write)",
    )
    p.add_argument(
        "--import",
        dest="modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="with --bisect: import it first in the bisection's process (the module that registers a custom op)",
    )
    p.set_defaults(func=run)


def saved_graphs(run_dir: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """Every compiled graph saved under ``run_dir`` (a run, or a check's runs): its id
    (``0/0/backward``), folder and probe record, those that differed first. A folder reached
    through a link, or whose ``meta.json`` is not a small regular file of JSON, is not one."""
    from ..eventlog.rundir import read_json_file

    found = []
    for folder in sorted(f for pattern in GRAPH_FOLDERS for f in run_dir.glob(pattern)):
        if any(p.is_symlink() for p in (folder, *folder.parents) if run_dir in p.parents):
            continue
        try:
            meta = read_json_file(folder / META, follow_links=False)
        except (OSError, ValueError, InputError):
            continue
        if isinstance(meta, dict) and isinstance(meta.get("compile_id"), str):
            found.append((f"{meta['compile_id']}/{meta.get('graph')}", folder, meta))
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


def _script_source() -> bytes:
    """The text of :mod:`torchrepro.capture.repro_script` (read, not imported: importing it imports torch)."""
    import importlib.util

    spec = importlib.util.find_spec("torchrepro.capture.repro_script")
    if spec is None or spec.origin is None:
        raise InputError("this torchrepro installation lacks capture/repro_script.py")
    return Path(spec.origin).read_bytes()


def read_graph(source: Path) -> tuple[dict[str, bytes], Saved]:
    """The files of the graph saved in ``source``, each read as run directories are
    (:func:`~torchrepro.eventlog.rundir.read_regular`: a regular file, not a link, under its cap),
    and what they hold, all checked together (:func:`~torchrepro.capture.repro_script.parse`):
    :class:`InputError` naming the first file that is missing or not what torchrepro writes."""
    from ..capture.repro_script import GRAPH_CODE, GRAPH_INPUTS, LIMITS, Unusable, parse, tensor_file
    from ..eventlog.rundir import read_regular

    names = (META, GRAPH_INPUTS, GRAPH_CODE, tensor_file(lambda name: os.path.lexists(source / name)))
    files = {}
    for name in names:
        try:
            files[name] = read_regular(source / name, LIMITS[name], follow_links=False)
        except FileNotFoundError:
            raise InputError(
                f"{source / name}: missing: the saved graph is incomplete, no reproducer written"
            ) from None
        except OSError as exc:
            raise InputError(f"{source / name}: unreadable ({exc.strerror or exc})") from None
    try:
        return files, parse(files)
    except Unusable as exc:
        why = str(exc).removeprefix(f"{exc.name}: ")
        raise InputError(f"{source / exc.name}: {why}: no reproducer written") from None


def foreign(run_dir: Path, source: Path) -> str | None:
    """Who but this user made, or may change, ``run_dir`` or the graph saved in ``source`` (its
    folders and files): ``PATH belongs to uid N`` or ``PATH can be written by others``; None when
    this user owns all of it and no one else may write it."""
    me = os.geteuid()
    for path in (run_dir, *(p for p in source.parents if run_dir in p.parents), source, *source.iterdir()):
        st = path.lstat()
        if st.st_uid != me:
            return f"{path} belongs to uid {st.st_uid}, not to you"
        if st.st_mode & stat.S_IWOTH:
            return f"{path} can be written by others"
    return None


def _inputs(run_dir: Path, out: Path) -> list[Path]:
    """What the reproducer must never be written onto: the run directory's own files (but the
    folder the reproducer goes to, ``RUN_DIR/repro`` by default, and the links it holds, which are
    no file of the run's: one to ``/`` would refuse every folder) and its runs' scripts."""
    from .outputs import recorded_inputs

    inside = out.absolute().parent == run_dir.absolute()
    return [
        *(p for p in run_dir.iterdir() if not p.is_symlink() and not (inside and p.name == out.name)),
        *([] if inside else [run_dir]),
        *recorded_inputs(run_dir),
    ]


def run(args: argparse.Namespace) -> int:
    """Write the reproducer; with ``--bisect``, bisect it: 0 a cause named, 1 nothing to name."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such directory")
    graph_id, source, meta = choose(run_dir, args.graph)
    out = Path(args.out) if args.out else run_dir / "repro"
    files, saved = read_graph(source)
    sha256 = hashlib.sha256(files["graph.py"]).hexdigest()
    if args.bisect and not args.trust_run_dir and (who := foreign(run_dir, source)):
        raise InputError(
            f"{who}: --bisect would run the run's code, {source / 'graph.py'} (sha256 {sha256}); "
            "read it, then pass --trust-run-dir (or leave out --bisect: nothing of the run runs then)"
        )
    from ..capture.repro_script import missing_op
    from ..eventlog.output_guard import output_folder

    with output_folder(out, [*files, SCRIPT], inputs=_inputs(run_dir, out), force=args.force) as folder:
        for name, data in files.items():
            folder.write(name, data)
        script = folder.write(SCRIPT, _script_source())
    probe = (
        f"{meta.get('runs_differing')} of {meta.get('repeats')} repeats differed when probed"
        if meta.get("repeats")
        else "not probed"
    )
    print(visible(f"compiled graph {graph_id} ({probe}): {script}"))
    print(visible(f"  run it: python {script}   (needs torch; exit 0 no difference, 1 it reproduces, 2 it cannot run)"))
    print(visible(f"  {out / 'graph.py'} is the run's code (sha256 {sha256}): repro.py runs it, and so does --bisect"))
    if (missing := missing_op(saved)) is not None:
        print(visible(f"  note: graph.py {missing}"))
    if not args.bisect:
        return 0
    if meta.get("differing"):  # a test that passes and fails by chance cannot be bisected
        print(visible(f"compiled graph {graph_id} differs from itself run to run ({probe}): not bisected"))
        return 1
    found = _bisect(out, args.modules)
    if found is None:
        print("bisect: the compiled graph matches eager bit for bit under every backend: nothing to name")
    else:
        print(visible(f"bisect: {found}"))
    if (differs := apart_from_verdict(run_dir, graph_id, found)) is not None:
        print(visible(f"  {differs}"))
    return 1 if found is None else 0


def _bisect(out: Path, modules: list[str]) -> str | None:
    """Bisect the reproducer in ``out`` in a process of its own (:mod:`~torchrepro.capture.graph_bisect`),
    ``modules`` imported there first: what it named, None when nothing; :class:`InputError` when it
    could not run, :class:`Stopped` when a signal stopped it (no verdict then)."""
    from .launcher import run_child

    print("bisecting: compiled against eager under each backend, in a process of its own ...", flush=True)
    package = str(Path(__file__).resolve().parents[2])  # the torchrepro this process runs
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (package, os.environ.get("PYTHONPATH")))))
    command = [sys.executable, "-m", "torchrepro.capture.graph_bisect", str(out), *modules]
    with tempfile.TemporaryDirectory(prefix="torchrepro-bisect-") as logs:
        ended = run_child(command, Path(logs), env=env, quiet=True)
        with open(Path(logs) / "stdout.log", "rb") as fp:  # its last line: what it found (what it printed before, not)
            fp.seek(max(0, os.fstat(fp.fileno()).st_size - 65536))
            lines = fp.read().decode("utf-8", "replace").splitlines()
    if ended.stopped_by is not None:
        raise Stopped(f"bisect: stopped by {ended.stopped_by}; no verdict", ended.stopped_by)
    try:
        said = json.loads(lines[-1]) if lines else None
    except ValueError:
        said = None
    if not isinstance(said, dict) or ended.exit_code not in (0, 1, 2):
        last = ended.stderr_tail[-1] if ended.stderr_tail else "no output"
        raise InputError(f"bisect: its process ended with exit code {ended.exit_code} ({last})")
    if ended.exit_code == 2:
        raise InputError(f"bisect: {said.get('error')}")
    return str(said.get("found")) if ended.exit_code == 0 else None


def apart_from_verdict(run_dir: Path, graph_id: str, found: str | None) -> str | None:
    """Why the bisection of ``graph_id`` (``found``; None: it matches eager under every backend) and the
    check's verdict name different things, in a line; None where they agree (the bisector names the op
    the verdict does) or no verdict names an op."""
    named = verdict_graph(run_dir)
    if named is None or not named.op:
        return None
    named_id = f"{named.compile_id}/{named.graph}"
    if named_id != graph_id:
        return f"the check's verdict names compiled graph {named_id}, not this one (--graph chose it)"
    op = named.op.split(" ", 1)[0]
    base = op.removeprefix("aten.").split(".", 1)[0]
    if found is None:
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
