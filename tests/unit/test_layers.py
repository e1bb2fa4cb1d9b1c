"""The package's layers, read from the source with ``ast`` (every import, also those inside
functions; those under ``if TYPE_CHECKING:``, which never run, only for the cycle rule: a circle
of type hints is a circle all the same). Each module's layer is its folder
(docs/architecture.md); nothing here lists modules by hand:

    base      torchrepro/__init__, errors, _lazy      what every layer may use
    eventlog  eventlog/                                the contract: events, run directories, traces
    library   the other root modules, host/            seed, rng, determinism, digests, checkpoint,
                                                       _dist, _state, _compat; files on this machine
    reports   reports/                                 the typed reports analysis builds
    analysis  analysis/                                events in, findings out
    render    render/                                  renderers: read a report, compute nothing
    telemetry telemetry/                               events and reports out over OTLP
    capture   capture/, cache/                         observers in the user's process; the cache library
    runtime   runtime/                                 what runs in the user's process around the script
    commands  commands/                                one per command, and what they share
    cli       cli.py, __main__.py                      dispatch

- a module imports only modules of its own layer or of a lower one (data flows one way: command ->
  launcher -> run directory -> event log -> analysis -> reports -> render);
- no import cycle between modules (not even through imports for type hints only), nor between folders (each top folder a node; the root modules
  grouped by their layer: base, library, cli);
- no two source files share a name (``__init__.py`` aside);
- ``cache/`` imports nothing of ``capture/`` (what both need is in ``host/``);
- ``analysis/``, ``reports/`` and ``render/`` reach neither torch, ``capture/``, ``_compat``, ``runtime/`` nor
  ``commands/``, not even through another module (they read event logs on a machine without torch);
- ``capture/`` and ``eventlog/`` reach none of ``analysis/``, ``reports/``, ``render/``: the event log holds
  what torch said, analysis decides what it means;
- only ``_compat`` names torch's private modules and attributes (``torch._inductor``, ``torch._C.x``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = "torchrepro"

LAYERS = (
    "base",
    "eventlog",
    "library",
    "reports",
    "analysis",
    "render",
    "telemetry",
    "capture",
    "runtime",
    "commands",
    "cli",
)
BASE = ("torchrepro", "torchrepro.errors", "torchrepro._lazy")
FOLDERS = {  # a folder's layer
    "eventlog": "eventlog",
    "host": "library",
    "analysis": "analysis",
    "reports": "reports",
    "render": "render",
    "telemetry": "telemetry",
    "capture": "capture",
    "cache": "capture",
    "runtime": "runtime",
    "commands": "commands",
}


def layer_of(name: str) -> str:
    """The layer of a module of the package, from where it lives."""
    parts = name.split(".")
    if name in BASE:
        return "base"
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in FOLDERS):
        return FOLDERS[parts[1]]
    return "cli" if parts[1] in ("cli", "__main__") else "library"


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node, but not what is under ``if TYPE_CHECKING:``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def imports_of(name: str, path: Path, modules: set[str], type_checking: bool = False) -> set[str]:
    """What a module imports: absolute names, ``from x import y`` also as ``x.y`` when that is a
    module of the package (``from . import rundir``); ``type_checking``: those under ``if
    TYPE_CHECKING:`` too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if type_checking else _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out |= {f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in modules}
    return out


def private_torch_names(path: Path) -> set[str]:
    """The private torch names a module imports or reads: ``torch._x``, ``torch.a._b`` (dunders
    such as ``torch.__version__`` are public)."""

    def private(dotted: str) -> bool:
        return dotted.split(".")[0] == "torch" and any(
            part.startswith("_") and not (part.startswith("__") and part.endswith("__")) for part in dotted.split(".")
        )

    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if private(alias.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found |= {f"{node.module}.{alias.name}" for alias in node.names if private(f"{node.module}.{alias.name}")}
        elif isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and private(".".join([value.id, *reversed(chain)])):
                found.add(".".join([value.id, *reversed(chain)]))
    return {name for name in found if not any(name != other and name.startswith(other + ".") for other in found)}


def load_graph(
    src: Path = SRC, type_checking: bool = False
) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, Path]]:
    """(internal import graph, every import by module, module paths) of the package under ``src``;
    ``type_checking``: with the imports under ``if TYPE_CHECKING:``."""
    paths = {module_name(p, src): p for p in sorted((src / PKG).rglob("*.py"))}
    raw = {name: imports_of(name, path, set(paths), type_checking) for name, path in paths.items()}
    graph = {name: {m for m in imported if m in paths and m != name} for name, imported in raw.items()}
    return graph, raw, paths


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def reach(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module ``start`` imports, directly or not, with the chain of imports to it."""
    chains, todo = {start: [start]}, [start]
    while todo:
        v = todo.pop()
        for w in sorted(graph[v]):
            if w not in chains:
                chains[w] = [*chains[v], w]
                todo.append(w)
    return chains


READERS = ("torchrepro.analysis", "torchrepro.reports", "torchrepro.render")  # events in, findings and pages out
WRITERS = ("torchrepro.capture", "torchrepro.eventlog")  # torch in, events out
# what readers must not reach: torch's observers and whatever runs or launches a script
READERS_MUST_NOT_REACH = ("torchrepro.capture", "torchrepro._compat", "torchrepro.runtime", "torchrepro.commands")


def layer_breaches(graph: dict[str, set[str]], raw: dict[str, set[str]]) -> list[str]:
    """Each module of a layer that reaches what it must not, with the chain of imports."""
    torch_users = {name for name, imported in raw.items() if any(within(m, ("torch",)) for m in imported)}
    out = []
    for name in sorted(graph):
        if within(name, READERS):
            banned = lambda m: within(m, READERS_MUST_NOT_REACH) or m in torch_users  # noqa: E731
        elif within(name, WRITERS):
            banned = lambda m: within(m, READERS)  # noqa: E731
        else:
            continue
        for module, chain in reach(graph, name).items():
            if banned(module):
                what = "imports torch" if module in torch_users and not within(module, READERS) else "is banned"
                out.append(f"{' -> '.join(chain)} ({module} {what})")
    return out


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a module to a module of a higher layer."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return [
        f"{a} ({layer_of(a)}) imports {b} ({layer_of(b)})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if rank[layer_of(b)] > rank[layer_of(a)]
    ]


def shared_basenames(paths: Iterable[Path]) -> dict[str, list[str]]:
    """Each file name (``__init__.py`` aside) that more than one of ``paths`` has, with where."""
    where: dict[str, list[str]] = {}
    for path in paths:
        if path.name != "__init__.py":
            where.setdefault(path.name, []).append(str(path))
    return {name: sorted(places) for name, places in where.items() if len(places) > 1}


def folder_of(name: str) -> str:
    """A module's node in the graph between folders: its top folder (``commands/check/`` is
    ``commands/``), or for a root module its layer (``base``, ``library``, ``cli``)."""
    parts = name.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in FOLDERS):
        return parts[1] + "/"
    return layer_of(name)


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folders import which (an import within a folder is no edge)."""
    folders: dict[str, set[str]] = {folder_of(name): set() for name in graph}
    for a, imported in graph.items():
        folders[folder_of(a)] |= {folder_of(b) for b in imported} - {folder_of(a)}
    return folders


# --- the tests ---------------------------------------------------------------------------------

GRAPH, RAW, PATHS = load_graph()
TYPED_GRAPH = load_graph(type_checking=True)[0]  # with the imports for type hints only


def test_the_graph_is_read_from_the_source():
    assert len(GRAPH) > 60 and "torchrepro.capture.session" in GRAPH
    assert "torchrepro.capture.steps" in GRAPH["torchrepro.capture.session"]  # from .steps import ...
    assert "torchrepro.capture.ops" in GRAPH["torchrepro.capture.session"]  # a function-level import
    assert "torchrepro.eventlog.events" in GRAPH["torchrepro.analysis.compile"]  # from ..eventlog.events import ...
    assert "torchrepro.eventlog.rundir" in GRAPH["torchrepro.render.html"]


def test_every_module_has_a_layer_from_its_folder():
    layers = {name: layer_of(name) for name in GRAPH}
    assert set(layers.values()) == set(LAYERS)
    assert layers["torchrepro.commands.check.fix_ladder"] == "commands"
    assert layers["torchrepro.runtime.follow"] == "runtime" and layers["torchrepro.seed"] == "library"
    assert layers["torchrepro.cli"] == "cli" and layers["torchrepro.reports.loader"] == "reports"
    assert upward_imports({"torchrepro.eventlog.tail": {"torchrepro.analysis.live"}}) != []  # the rule can fail


def test_the_package_root_holds_the_public_face_only():
    root = sorted(p.stem for p in (SRC / PKG).glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(root) <= 12, root


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    assert upward_imports(GRAPH) == []


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_no_two_source_files_share_a_name():
    assert shared_basenames(PATHS.values()) == {}
    assert shared_basenames([Path("a/cache.py"), Path("b/cache.py"), Path("a/__init__.py"), Path("b/__init__.py")]) == {
        "cache.py": ["a/cache.py", "b/cache.py"]
    }  # the rule can fail


def test_no_import_cycle_between_folders():
    folders = folder_graph(GRAPH)
    assert {"base", "library", "cli", "reports/", "render/", "cache/", "capture/", "host/"} <= set(folders)
    assert cycles(folders) == []
    assert cycles(
        folder_graph(
            {
                "torchrepro.cache.layout": {"torchrepro.capture.ops"},
                "torchrepro.capture.ops": {"torchrepro.cache.lock"},
                "torchrepro.cache.lock": set(),
            }
        )
    ) == [["cache/", "capture/"]]  # the rule can fail


def test_the_cache_library_imports_nothing_of_capture():
    assert "capture/" not in folder_graph(GRAPH)["cache/"]


def test_no_import_cycle_even_through_type_hints():
    assert cycles(TYPED_GRAPH) == []


def test_imports_for_type_hints_are_read_and_a_circle_through_them_fails(tmp_path):
    assert "torchrepro.reports.loader" in TYPED_GRAPH["torchrepro.telemetry.otlp"]  # under if TYPE_CHECKING:
    assert "torchrepro.reports.loader" not in GRAPH["torchrepro.telemetry.otlp"]
    package = tmp_path / PKG
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .high import High\n"
    )
    (package / "high.py").write_text("from .low import low\n")
    assert cycles(load_graph(tmp_path)[0]) == []  # at run time: no circle
    assert cycles(load_graph(tmp_path, type_checking=True)[0]) == [["torchrepro.high", "torchrepro.low"]]


def test_analysis_and_report_reach_no_torch_capture_or_launcher_and_capture_reaches_no_analysis():
    assert layer_breaches(GRAPH, RAW) == []


def test_only_compat_names_private_torch_apis():
    found = {
        (name, private)
        for name, path in PATHS.items()
        if name != "torchrepro._compat"
        for private in private_torch_names(path)
    }
    assert found == set(), "import it through torchrepro._compat (a probe there)"


PRIVATE_TORCH_ATTRIBUTES = {"_orig_mod", "_boxed_call", "_opname"}


def private_attributes_read(path: Path) -> set[str]:
    """The private torch attribute names (:data:`PRIVATE_TORCH_ATTRIBUTES`) a module reads or sets:
    as ``x._name`` or as a string constant (``getattr(x, "_name")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_TORCH_ATTRIBUTES:
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_TORCH_ATTRIBUTES:
            found.add(node.value)
    return found


def test_only_compat_reads_private_attributes_of_torch_objects():
    found = {
        (name, attribute)
        for name, path in PATHS.items()
        if name != "torchrepro._compat"
        for attribute in private_attributes_read(path)
    }
    assert found == set(), "read it through an accessor in torchrepro._compat"
    assert private_attributes_read(PATHS["torchrepro._compat"]) == PRIVATE_TORCH_ATTRIBUTES
