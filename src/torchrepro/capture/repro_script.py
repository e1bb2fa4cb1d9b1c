"""Reproduce one compiled graph of a training run, standalone: needs torch only, neither the
training script nor torchrepro.

    python repro.py [--runs K] [--threads N] [--backend inductor] [--import MODULE]

It loads the graph's FX code (``graph.py``: the aten graph the compiler was given, its parameters
as inputs) and the inputs of its first call in the run, compiles it with ``torch.compile``, calls
it K times on fresh copies of those inputs and compares every output bit for bit (run to run),
then compares the compiled outputs with the same graph run eagerly (compiled vs eager).

``graph.py`` is the run's code: running this script runs it. Read it first when the run is not
your own. Every other file is data, checked before anything is allocated or run: regular files
only (no link, FIFO or device), each under its size cap, every declared shape, stride and dtype
against the bytes stored and against a memory budget.

Exit 0 when both agree bit for bit, 1 when either differs (the divergence reproduces), 2 when it
could not run: one line naming the input and why (a file missing, damaged or not what torchrepro
writes; a custom op this process has not registered: ``--import`` the module that registers it).
"""

from __future__ import annotations

import argparse
import ast
import errno
import hashlib
import importlib
import io
import json
import math
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

HERE = Path(__file__).resolve().parent
GRAPH_CODE, GRAPH_INPUTS, GRAPH_META = "graph.py", "inputs.json", "meta.json"
TENSOR_FILES = ("inputs.safetensors", "inputs.pt")  # the first is written; the second by older versions
MAX_SAVED_BYTES = 256 << 20  # the tensors of a saved graph, at most (a graph whose inputs take more is not saved)
MEMORY_BUDGET = 1 << 30  # the stored tensors and the inputs rebuilt from them, in all, at most
LIMITS = {  # the largest file of each kind torchrepro writes, in bytes
    GRAPH_META: 1 << 20,
    GRAPH_INPUTS: 16 << 20,
    GRAPH_CODE: 16 << 20,
    **dict.fromkeys(TENSOR_FILES, MAX_SAVED_BYTES + (16 << 20)),
}
MAX_DIMS = 64
DEVICES = ("cpu", "cuda", "xpu")  # where an input may have been (rebuilt there: torch.<device>.is_available())
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}
_NAME = re.compile(r"[\w./\[\]-]{1,128}")  # a compile id, a graph, a tensor's key or a constant's name
_OP = re.compile(r"torch\.ops\.(\w+)\.(\w+)")


class Unusable(Exception):
    """An input of the saved graph that cannot be used: ``name`` (the file) and why."""

    def __init__(self, name: str, why: str):
        super().__init__(f"{name}: {why}")
        self.name = name


# --- reading the saved graph ---------------------------------------------------------------------


def read_input(here: Path, name: str) -> bytes:
    """The bytes of the file ``name`` in ``here``: a regular file under its cap (:data:`LIMITS`),
    never followed through a link, never waited on (a FIFO) or read on end (a device)."""
    try:
        fd = os.open(here / name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Unusable(name, "missing") from None
    except OSError as exc:
        raise Unusable(name, "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unusable(name, "not a regular file (a FIFO, a device or a directory)")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as fp:
        data = fp.read(LIMITS[name] + 1)
    if len(data) > LIMITS[name]:
        raise Unusable(name, f"over {LIMITS[name]} bytes: not a file torchrepro wrote")
    return data


def tensor_file(present: Callable[[str], bool]) -> str:
    """The name of the saved graph's tensor file (``present(name)``: whether it is there)."""
    return next((name for name in TENSOR_FILES if present(name)), TENSOR_FILES[0])


def read_saved(here: Path) -> dict[str, bytes]:
    """The files of the saved graph in ``here`` by name (:func:`read_input`)."""
    names = (GRAPH_META, GRAPH_INPUTS, GRAPH_CODE, tensor_file(lambda n: os.path.lexists(here / n)))
    return {name: read_input(here, name) for name in names}


@dataclass
class Stored:
    """A tensor of the tensor file, declared and checked, not yet made (:meth:`Saved.tensors`)."""

    dtype: torch.dtype
    shape: list[int]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class Saved:
    """A saved graph, every file checked (:func:`parse`): what the probe found, how to rebuild each
    input, the constants it reads, its code and its tensors."""

    meta: dict[str, Any]
    inputs: list[dict[str, Any]]
    constants: list[str]
    source: str
    stored: dict[str, Stored]
    data: bytes  # the tensor file's bytes (safetensors), or b"" where ``loaded`` holds them (inputs.pt)
    loaded: dict[str, torch.Tensor] | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored tensors, made from the file's bytes."""
        if self.loaded is not None:
            return dict(self.loaded)
        view = memoryview(self.data)
        out = {}
        for key, t in self.stored.items():
            flat = (  # a copy of its bytes: the graph may write into its inputs
                torch.frombuffer(bytearray(view[t.start : t.end]), dtype=t.dtype)
                if t.nbytes
                else torch.empty(0, dtype=t.dtype)
            )
            out[key] = flat.reshape(t.shape)
        return out

    def ops(self) -> list[tuple[str, str]]:
        """The ``torch.ops.NAMESPACE.OP`` the code calls, each once."""
        return sorted(set(_OP.findall(self.source)))


def _json(name: str, data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Unusable(name, f"not JSON ({' '.join(str(exc).split())[:120]})") from None


def _count(value: Any, name: str, what: str, most: int, least: int = 0) -> int:
    """``value`` if it is an integer from ``least`` to ``most``, else :class:`Unusable` naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= most:
        raise Unusable(name, f"{what} is {_shown(value)}, not an integer from {least} to {most}")
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, list, dict)) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _label(value: Any, name: str, what: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise Unusable(name, f"{what} is {_shown(value)}, not a name torchrepro writes")
    return value


def _meta(data: bytes) -> dict[str, Any]:
    meta = _json(GRAPH_META, data)
    if not isinstance(meta, dict):
        raise Unusable(GRAPH_META, "not a JSON object")
    _label(meta.get("compile_id"), GRAPH_META, "'compile_id'")
    _label(meta.get("graph"), GRAPH_META, "'graph'")
    for field, least, most in (("threads", 1, 4096), ("repeats", 0, 1 << 20), ("runs_differing", 0, 1 << 20)):
        if meta.get(field) is not None:
            _count(meta[field], GRAPH_META, repr(field), most, least)
    version = meta.get("torch_version")
    if version is not None and (not isinstance(version, str) or not re.fullmatch(r"[\w.+-]{1,64}", version)):
        raise Unusable(GRAPH_META, f"'torch_version' is {_shown(version)}, not a version")
    return meta


def _safetensors(data: bytes) -> dict[str, Stored]:
    """The tensors a safetensors file declares, each checked against the bytes it holds."""
    name = TENSOR_FILES[0]
    if len(data) < 8:
        raise Unusable(name, "shorter than its header")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise Unusable(name, f"declares a header of {size} bytes in a file of {len(data)}")
    header = _json(name, data[8 : 8 + size])
    if not isinstance(header, dict):
        raise Unusable(name, "its header is not a JSON object")
    room = len(data) - 8 - size
    stored = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        what = f"tensor {_shown(key)}"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("dtype"), str)
            or entry["dtype"] not in SAFETENSORS_DTYPES
        ):
            raise Unusable(name, f"{what}: no dtype torch knows")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise Unusable(name, f"{what}: its shape is {_shown(shape)}, not a list of at most {MAX_DIMS} sizes")
        dims = [_count(n, name, f"{what}: a size", MAX_SAVED_BYTES) for n in shape]
        if not isinstance(offsets, list) or len(offsets) != 2:
            raise Unusable(name, f"{what}: its data_offsets are {_shown(offsets)}, not [start, end]")
        start, end = (_count(n, name, f"{what}: an offset", room) for n in offsets)
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        if end - start != math.prod(dims) * dtype.itemsize:
            raise Unusable(
                name,
                f"{what}: {entry['dtype']}{dims} takes {math.prod(dims) * dtype.itemsize} bytes, it holds {end - start}",
            )
        stored[key] = Stored(dtype, dims, 8 + size + start, 8 + size + end)
    return stored


def _pickled(data: bytes) -> dict[str, torch.Tensor]:
    """The tensors of an ``inputs.pt`` (plain tensors only: ``weights_only``, which also checks
    each storage against the bytes its archive holds before making it)."""
    name = TENSOR_FILES[1]
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- a damaged archive fails in many ways
        raise Unusable(name, f"not a file of plain tensors ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and type(v) is torch.Tensor for k, v in loaded.items()
    ):
        raise Unusable(name, "not a dictionary of tensors")
    return loaded


def _extent(size: list[int], stride: list[int]) -> int:
    """The elements a tensor of ``size`` and ``stride`` spans in its storage."""
    return 0 if 0 in size else 1 + sum((n - 1) * s for n, s in zip(size, stride))


def _inputs(spec: Any, stored: dict[str, Stored]) -> tuple[list[dict[str, Any]], list[str], int]:
    """The inputs and constants ``inputs.json`` declares, checked against the stored tensors; the
    bytes the inputs rebuilt take."""
    name = GRAPH_INPUTS
    if (
        not isinstance(spec, dict)
        or not isinstance(spec.get("inputs"), list)
        or not isinstance(spec.get("constants"), list)
    ):
        raise Unusable(name, "not an object with 'inputs' and 'constants' lists")
    constants = [_label(c, name, "a constant") for c in spec["constants"]]
    for constant in constants:
        if f"const.{constant}" not in stored:
            raise Unusable(name, f"the constant {constant} is not among the stored tensors")
    rebuilt = 0
    for i, item in enumerate(spec["inputs"]):
        what = f"input {i}"
        if not isinstance(item, dict) or item.get("kind") not in ("tensor", "value"):
            raise Unusable(name, f"{what} is neither a tensor nor a value")
        if item["kind"] == "value":
            value = item.get("value")
            if value is not None and not isinstance(value, (bool, int, float)):
                raise Unusable(name, f"{what} is {_shown(value)}, not a number")
            continue
        key = _label(item.get("key"), name, f"{what}'s key")
        if key not in stored:
            raise Unusable(name, f"{what}'s tensor {key} is not among the stored tensors")
        size, strides = item.get("size"), item.get("stride")
        if (
            not isinstance(size, list)
            or not isinstance(strides, list)
            or len(size) != len(strides)
            or len(size) > MAX_DIMS
        ):
            raise Unusable(name, f"{what}: size {_shown(size)} and stride {_shown(strides)} do not match")
        dims = [_count(n, name, f"{what}: a size", MEMORY_BUDGET) for n in size]
        steps = [_count(n, name, f"{what}: a stride", MEMORY_BUDGET) for n in strides]
        if dims != stored[key].shape:
            raise Unusable(name, f"{what} has size {dims}, its stored tensor {stored[key].shape}")
        rebuilt += _extent(dims, steps) * stored[key].dtype.itemsize
        if rebuilt > MEMORY_BUDGET:
            raise Unusable(name, f"its inputs would take more than {MEMORY_BUDGET >> 20} MiB rebuilt")
        device = item.get("device")
        try:
            kind = torch.device(device).type if isinstance(device, str) else None
        except (RuntimeError, TypeError, ValueError):
            kind = None
        if kind not in DEVICES:
            raise Unusable(name, f"{what}'s device is {_shown(device)}, not one of {', '.join(DEVICES)}")
    return spec["inputs"], constants, rebuilt


def _code(data: bytes) -> str:
    try:
        source = data.decode("utf-8")
        tree = ast.parse(source, GRAPH_CODE)
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Unusable(GRAPH_CODE, f"not Python ({' '.join(str(exc).split())[:120]})") from None
    if not any(isinstance(node, ast.ClassDef) and node.name == "Graph" for node in tree.body):
        raise Unusable(GRAPH_CODE, "defines no class Graph")
    return source


def parse(files: dict[str, bytes]) -> Saved:
    """A saved graph from its files' bytes (:func:`read_saved`), every one checked: :class:`Unusable`
    naming the first that is not what torchrepro writes. Nothing is allocated beyond the bytes given,
    nothing is run."""
    meta = _meta(files[GRAPH_META])
    source = _code(files[GRAPH_CODE])
    name = tensor_file(files.__contains__)
    data = files[name]
    loaded = None
    if name == TENSOR_FILES[0]:
        stored = _safetensors(data)
    else:
        loaded, data = _pickled(data), b""
        stored = {k: Stored(t.dtype, list(t.shape), 0, t.numel() * t.element_size()) for k, t in loaded.items()}
    rng = stored.get("rng.cpu")
    if rng is None or rng.dtype != torch.uint8 or len(rng.shape) != 1:
        raise Unusable(name, "holds no CPU RNG state (rng.cpu, bytes)")
    inputs, constants, rebuilt = _inputs(_json(GRAPH_INPUTS, files[GRAPH_INPUTS]), stored)
    if rebuilt + sum(t.nbytes for t in stored.values()) > MEMORY_BUDGET:
        raise Unusable(
            name, f"its tensors and the inputs rebuilt from them would take more than {MEMORY_BUDGET >> 20} MiB"
        )
    return Saved(meta, inputs, constants, source, stored, data, loaded)


def safetensors_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """``tensors`` in the safetensors format (what :func:`parse` reads; ``safetensors`` loads it too)."""
    names = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {}
    parts, offset = [], 0
    for key, t in tensors.items():
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[key] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        parts.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(parts)


# --- running it ----------------------------------------------------------------------------------


def missing_op(saved: Saved) -> str | None:
    """The first ``torch.ops`` op the code calls that no module imported so far registers, with how
    to register it; None when every one is."""
    for namespace, op in saved.ops():
        if not hasattr(getattr(torch.ops, namespace), op):
            return (
                f"calls torch.ops.{namespace}.{op}, which this process has not registered: run with --import MODULE, "
                "the module that registers it (torch.library.custom_op, TORCH_LIBRARY), as the training script did"
            )
    return None


def load_graph(saved: Saved, tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    """The ``Graph`` module of the saved code (run here: the run's code), its constants set from ``tensors``."""
    if (missing := missing_op(saved)) is not None:
        raise Unusable(GRAPH_CODE, missing)
    namespace: dict[str, Any] = {"__name__": "graph"}
    try:
        exec(compile(saved.source, GRAPH_CODE, "exec"), namespace)
        graph: torch.nn.Module = namespace["Graph"]()
    except Exception as exc:  # noqa: BLE001 -- the saved code failed to load
        raise Unusable(GRAPH_CODE, f"failed to load ({_first_line(exc)})") from None
    for name in saved.constants:
        owner, path = graph, name.split(".")
        for part in path[:-1]:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.register_buffer(path[-1], tensors["const." + name])
    return graph


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def fresh_inputs(spec: list[dict[str, Any]], tensors: dict[str, torch.Tensor]) -> list[Any]:
    out: list[Any] = []
    for item in spec:
        if item["kind"] == "value":
            out.append(item["value"])
            continue
        saved = tensors[item["key"]]
        x = torch.empty_strided(item["size"], item["stride"], dtype=saved.dtype, device=item["device"])
        out.append(x.copy_(saved))
    return out


def flat(values: Any) -> list[Any]:
    if isinstance(values, (list, tuple)):
        return [leaf for v in values for leaf in flat(v)]
    return [values]


def digest(x: Any) -> str:
    if not isinstance(x, torch.Tensor):
        return repr(x)
    data = x.detach().cpu().contiguous().reshape(-1)
    raw = data.view(torch.uint8) if data.numel() else data
    return f"{x.dtype}{tuple(x.shape)}:" + hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]


def max_abs(x: Any, y: Any) -> float:
    if not isinstance(x, torch.Tensor) or not x.numel() or x.shape != y.shape:
        return float("nan")
    return float((x.detach().double() - y.detach().double()).abs().max())


def same_outputs(xs: list[Any], ys: list[Any]) -> bool:
    return len(xs) == len(ys) and all(digest(x) == digest(y) for x, y in zip(xs, ys))


def call(
    fn: Callable[..., Any], spec: list[dict[str, Any]], tensors: dict[str, torch.Tensor], rng: torch.Tensor
) -> list[Any]:
    torch.random.set_rng_state(rng)
    with torch.no_grad():
        return flat(fn(*fresh_inputs(spec, tensors)))


def load_saved(here: Path, modules: Sequence[str] = ()) -> tuple[Saved, dict[str, torch.Tensor], torch.Tensor]:
    """The saved graph in ``here`` read and checked (:func:`read_saved`, :func:`parse`), ``modules``
    imported (those that register its custom ops), its tensors made, the CPU RNG state apart."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 -- the user's module failed to import
            raise Unusable(f"--import {module}", _first_line(exc)) from None
    saved = parse(read_saved(here))
    for i, item in enumerate(saved.inputs):
        device = torch.device(item["device"]) if item["kind"] == "tensor" else None
        if device is not None and device.type != "cpu" and not getattr(torch, device.type).is_available():
            raise Unusable(GRAPH_INPUTS, f"input {i} was on {device}, which this machine lacks")
    tensors = saved.tensors()
    return saved, tensors, tensors.pop("rng.cpu")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def reproduce(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--runs", type=positive, help="compiled calls compared (default: the probe's repeats, at least 8)"
    )
    parser.add_argument("--threads", type=positive, help="intra-op threads (default: the run's)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument(
        "--import",
        dest="modules",
        action="append",
        default=[],
        metavar="MODULE",
        help="import it first (a custom op's)",
    )
    args = parser.parse_args(argv)
    saved, tensors, rng = load_saved(HERE, args.modules)
    meta = saved.meta
    runs = args.runs or max(8, meta.get("repeats") or 0)
    threads = args.threads or meta.get("threads") or torch.get_num_threads()
    torch.set_num_threads(threads)
    graph = load_graph(saved, tensors)
    try:
        compiled = torch.compile(graph, backend=args.backend)
        what = f"compiled graph {meta['compile_id']} ({meta['graph']}), torch {torch.__version__}, {threads} thread(s)"
        print(f"{what}: recorded with torch {meta.get('torch_version')}")
        first = call(compiled, saved.inputs, tensors, rng)
        reference = [digest(x) for x in first]
        differing: set[int] = set()
        runs_differing, largest = 0, 0.0
        for _ in range(runs - 1):
            outs = call(compiled, saved.inputs, tensors, rng)
            now = {i for i, x in enumerate(outs) if digest(x) != reference[i]}
            runs_differing += bool(now)
            differing |= now
            largest = max([largest] + [max_abs(first[i], outs[i]) for i in now])
        eager = call(graph, saved.inputs, tensors, rng)
    except Exception as exc:  # noqa: BLE001 -- compiling or calling the graph failed: said in one line
        raise Unusable(GRAPH_CODE, f"compiling or calling it failed ({_first_line(exc)})") from None
    if differing:
        print(
            f"RUN TO RUN: DIFFERS: {runs_differing} of {runs - 1} repeated calls differ from the first, "
            f"output(s) {sorted(differing)}, by up to {largest:.3g}"
        )
    else:
        print(f"run to run: {runs} calls bit for bit the same")
    against = [i for i, (x, y) in enumerate(zip(first, eager)) if digest(x) != digest(y)]
    if against:
        worst = max(max_abs(first[i], eager[i]) for i in against)
        print(f"COMPILED VS EAGER: DIFFERS: output(s) {against[:10]} differ, by up to {worst:.3g}")
    else:
        print("compiled vs eager: bit for bit the same")
    print(f"recorded in the run: {meta.get('runs_differing')} of {meta.get('repeats')} repeats differed")
    return 1 if differing or against else 0


def main(argv: list[str] | None = None) -> int:
    """:func:`reproduce`; an input that cannot be used is one line and exit 2."""
    try:
        return reproduce(argv)
    except Unusable as exc:
        print(f"repro.py: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
