"""A structure-aware fuzz of what ``repro`` and ``diff`` read from a run directory someone else made,
and of the folder ``repro`` writes into, driven in one process (thousands of cases in seconds):

- ``graph``: a saved graph folder (``rank-<r>/graphs/<id>/``: ``graph.py``, ``inputs.json``,
  ``meta.json``, ``inputs.safetensors``), each case one file made hostile: missing, a link (to a
  private file, ``/dev/zero``, a folder), a FIFO, a folder, empty, over its cap, cut, flipped; a JSON
  field of another type, huge, negative or NaN (the generator of tests/rundir_fuzz.py); a tensor
  header declaring other dtypes, shapes (2^40 x 2^40) or offsets than its bytes; code that does not
  parse, nests deeply, defines no ``Graph``, calls an op nobody registered, or runs at import. Read
  by torchrepro (``commands.repro.read_graph``: the run directory's bounded readers) and by the
  script (``repro_script.read_saved`` and ``parse``): both must agree, every refusal one line naming
  the file, and nothing of the code run.
- ``snapshot``: a parameter snapshot and a sketch (``snapshots/step-<n>.npz``, ``sketch-<n>.npz``),
  each case one made hostile: the file-level cases above, an array header declaring 2^40 elements,
  Python objects, another dtype or shape, a compressed member, values replaced (zeros, shuffled, one
  bit), tensors missing or added. What ``load_snapshot`` accepts must be bit for bit what the run
  recorded; anything else is one line naming the file, or not compared (None).
- ``output``: the folder ``repro`` writes (``output_guard.output_folder``) in every state a run
  directory from elsewhere may leave it: a link, a file, holding links, FIFOs, folders or earlier
  files, with and without ``--force``. No file outside it changes, ever.

Run as ``python graph_fuzz.py KIND N SEED``: prints a JSON summary; any other outcome (an exception
that is not the one-line refusal, a case over :data:`CASE_S` seconds) ends it with a traceback
(tests/e2e/test_graph_fuzz.py runs it under a memory limit)."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torchrepro.errors import InputError

from rundir_fuzz import inputs as json_inputs

CASE_S = 10  # a case that takes longer is a hang
FILES = ("graph.py", "inputs.json", "meta.json", "inputs.safetensors")
MARKER = "ran-at-import"


def _one_line(exc: Exception, where: Any) -> None:
    text = str(exc)
    assert "\n" not in text and str(where) in text, text


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError(f"a case took over {CASE_S} s")


def file_cases(path: Path, secret: Path, cap: int) -> list[tuple[str, Callable[[], None]]]:
    """Each way to make the file ``path`` hostile without looking inside it."""

    def link(target: Path | str) -> Callable[[], None]:
        return lambda: (path.unlink(missing_ok=True), path.symlink_to(target))

    def replace(make: Callable[[], None]) -> Callable[[], None]:
        return lambda: (path.unlink(missing_ok=True), make())

    return [
        ("missing", lambda: path.unlink()),
        ("a link to a private file", link(secret)),
        ("a link to /dev/zero", link("/dev/zero")),
        ("a link to a folder", link(secret.parent)),
        ("a dangling link", link(secret.parent / "nothing")),
        ("a FIFO", replace(lambda: os.mkfifo(path))),
        ("a folder", replace(lambda: path.mkdir())),
        ("empty", lambda: path.write_bytes(b"")),
        ("over its cap (sparse)", lambda: os.truncate(path, cap + 1)),
    ]


def _mutated(data: bytes, rng: random.Random) -> bytes:
    how = rng.randrange(4)
    out = bytearray(data)
    if how == 0 and out:
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
    elif how == 1:
        out = out[: rng.randrange(len(out) + 1)]
    elif how == 2 and out:
        i = rng.randrange(len(out))
        out[i:i] = out[i : i + rng.randint(1, 64)] * rng.randint(2, 30)
    else:
        out += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(out)


# --- saved graph folders ---------------------------------------------------------------------------


def _base_graph(folder: Path) -> None:
    """A real saved graph: a constant, a value input and a transposed tensor input (save_graph)."""
    import torch

    from torchrepro.capture.graph_probe import GraphProbe, _Call, save_graph

    class Scaled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("offset", torch.arange(4.0))

        def forward(self, x: torch.Tensor, n: int) -> Any:
            return torch.ops.aten.mm.default(x.t(), x) + self.offset * n, torch.ops.aten.sum.default(x)

    gm = torch.fx.symbolic_trace(Scaled())
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).t()
    call = _Call("0/0", "forward", lambda args: gm(*args), [x, 3], torch.random.get_rng_state(), [])
    save_graph(folder, gm, call, GraphProbe(compile_id="0/0", graph="forward", repeats=2, runs_differing=1, threads=1))


def _safetensors_cases(data: bytes, rng: random.Random, n: int) -> Iterator[bytes]:
    """The tensor file with its header made hostile (the bytes after it kept)."""
    size = int.from_bytes(data[:8], "little")
    header, body = json.loads(data[8 : 8 + size]), data[8 + size :]

    def encoded(doc: bytes) -> bytes:
        return len(doc).to_bytes(8, "little") + doc + body

    for declared in (0, 7, len(data), 1 << 62, (1 << 64) - 1):
        yield declared.to_bytes(8, "little") + data[8:]
    key = next(k for k in header if k != "__metadata__")
    for shape in ([1 << 40, 1 << 40], [-1, 4], [0, 1 << 40], [3.5], ["4"], [None], [1] * 70, []):
        yield encoded(json.dumps({**header, key: {**header[key], "shape": shape}}).encode())
    for offsets in ([0, 1 << 40], [-8, 0], [8, 0], [0], [len(body), len(body) + 8]):
        yield encoded(json.dumps({**header, key: {**header[key], "data_offsets": offsets}}).encode())
    for dtype in ("F128", "U64", "", None, "BF16", "I64"):
        yield encoded(json.dumps({**header, key: {**header[key], "dtype": dtype}}).encode())
    yield from (encoded(doc) for doc in json_inputs(header, n, rng, lambda d: json.dumps(d).encode()))


HOSTILE_CODE = [
    b"def broken(:\n",
    b"import torch\n\nclass NotGraph(torch.nn.Module):\n    pass\n",
    b"(" * 200_000,
    b"\xff\xfe\x00graph",
    b"x = 1\x00\n",
    b"import torch\n\nclass Graph(torch.nn.Module):\n    def forward(self, x, n):\n"
    b"        return (torch.ops.nope_ns.missing_op.default(x),)\n",
    b"import torch\nopen(" + repr(MARKER).encode() + b", 'w').write('ran')\n\nclass Graph(torch.nn.Module):\n"
    b"    def forward(self, x, n):\n        return (x,)\n",
    b"import torch\n\nclass Graph(torch.nn.Module):\n    x = '" + b"a" * (1 << 20) + b"'\n",
]


def graph(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """Saved graph folders (see the module)."""
    from torchrepro.capture.repro_script import LIMITS, Unusable, missing_op, parse, read_saved
    from torchrepro.commands.repro import choose, read_graph, saved_graphs

    base = root / "base"
    _base_graph(base)
    originals = {name: (base / name).read_bytes() for name in FILES}
    secret = root / "secret.txt"
    secret.write_text("a private file")
    run = root / "run"
    folder = run / "rank-0" / "graphs" / "0_0-forward"
    counts = {"clean": 0, "damage": 0}

    def cases() -> Iterator[tuple[str, Callable[[], None]]]:
        for name in FILES:
            for what, make in file_cases(folder / name, secret, LIMITS[name]):
                yield f"{name}: {what}", make
        for data in HOSTILE_CODE:
            yield f"graph.py: {data[:30]!r}", lambda data=data: (folder / "graph.py").write_bytes(data)
        per = max(1, (n - 100) // 5)
        for name in ("meta.json", "inputs.json"):
            doc = json.loads(originals[name])
            for data in json_inputs(doc, per, rng, lambda d: json.dumps(d).encode()):
                yield f"{name}: hostile field", lambda data=data, name=name: (folder / name).write_bytes(data)
        for data in _safetensors_cases(originals["inputs.safetensors"], rng, per):
            yield (
                "inputs.safetensors: hostile header",
                lambda data=data: (folder / "inputs.safetensors").write_bytes(data),
            )
        while True:
            name = rng.choice(FILES)
            data = _mutated(originals[name], rng)
            yield f"{name}: mutated", lambda data=data, name=name: (folder / name).write_bytes(data)

    for i, (what, make) in enumerate(cases()):
        if i >= n:
            break
        if folder.exists():
            for child in folder.iterdir():
                child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            (folder / name).write_bytes(originals[name])
        make()
        signal.alarm(CASE_S)
        try:
            try:
                files, saved = read_graph(folder)
                ours: str | None = None
            except InputError as exc:
                _one_line(exc, folder)
                ours = str(exc)
            try:
                script = parse(read_saved(folder))
                theirs: str | None = None
            except Unusable as exc:
                assert "\n" not in str(exc) and str(exc).startswith(exc.name), str(exc)
                theirs = str(exc)
            assert (ours is None) == (theirs is None), (what, ours, theirs)  # one check, two readers
            if ours is None:
                counts["clean"] += 1
                assert files.keys() >= {"graph.py", "inputs.json", "meta.json"}, what
                missing_op(script)
                if i % 10 == 0:
                    sum(t.numel() for t in script.tensors().values())  # within the budget parse checked
            else:
                counts["damage"] += 1
            if i % 20 == 0:
                try:
                    choose(run, None)
                except InputError as exc:
                    _one_line(exc, run)
                saved_graphs(run)
        except BaseException as exc:
            raise AssertionError(f"case {i} ({what}): {type(exc).__name__}: {exc}") from exc
        finally:
            signal.alarm(0)
        assert not Path(MARKER).exists(), f"case {i} ({what}): graph.py ran while only read"
    return counts


# --- parameter snapshots ---------------------------------------------------------------------------


def _npy(shape: tuple[int, ...], descr: str, body: bytes, fortran: bool = False) -> bytes:
    """A version 1.0 ``.npy`` of ``descr`` declaring ``shape``, holding ``body``."""
    header = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + body


def _npz(members: dict[str, bytes], compress: bool = False) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


def _base_run(folder: Path) -> tuple[Any, dict[str, Any]]:
    """Snapshots of three steps of a small model (float32, bfloat16 and complex parameters) and the
    event log that records them; the arrays of step 2 as written."""
    import numpy as np
    import torch

    from torchrepro.capture.snapshots import SnapshotWriter
    from torchrepro.digests import fingerprint
    from torchrepro.eventlog.event_reader import EventLog
    from torchrepro.eventlog.events import Params, Step

    g = torch.Generator().manual_seed(0)
    names = ["emb.weight", "fc.weight", "fc.bias", "rot"]
    params = [
        torch.randn(3000, 8, generator=g),
        torch.randn(16, 8, generator=g).bfloat16(),
        torch.randn(16, generator=g),
        torch.randn(5, generator=g, dtype=torch.complex64),
    ]
    writer = SnapshotWriter(folder)
    steps = []
    for step in range(3):
        for p in params:
            p.add_(0.01)
        assert writer.write(step, names, [p.clone() for p in params]) is None
        fps = [fingerprint(p)[:16] for p in params] if step != 1 else None  # step 1: not fingerprinted
        steps.append(Step(index=step, step=step, param_fps=fps))
    events = [
        Params(
            names=names,
            shapes=[list(p.shape) for p in params],
            dtypes=[str(p.dtype).removeprefix("torch.") for p in params],
            kinds=["tensor"] * len(params),
        ),
        *steps,
    ]
    with np.load(folder / "step-0000002.npz") as data:
        kept = {k: data[k].copy() for k in data.files}
    return EventLog(folder / "events.jsonl", events=events), kept


def _snapshot_cases(kept: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """``step-<n>.npz`` contents made hostile inside the archive."""
    import numpy as np

    def npy(a: Any) -> bytes:
        out = io.BytesIO()
        np.save(out, a)
        return out.getvalue()

    good = {f"{k}.npy": npy(v) for k, v in kept.items()}
    name = "emb.weight.npy"
    body = npy(kept["emb.weight"])[128:]
    for shape in ((1 << 40,), (1 << 40, 1 << 40), (3000, 8, 2), (0,), (8, 3000), (24000,)):
        yield f"declares {shape}", _npz({**good, name: _npy(shape, "<f4", body)})
    for descr in ("|O", "<f8", "<i4", ">f4", "<f2"):
        yield f"dtype {descr}", _npz({**good, name: _npy((3000, 8), descr, body)})
    yield "fortran order", _npz({**good, name: _npy((3000, 8), "<f4", body, fortran=True)})
    yield "compressed", _npz(good, compress=True)
    yield "a member that is no array", _npz({**good, "x.txt": b"hello"})
    yield "a tensor missing", _npz({k: v for k, v in good.items() if k != name})
    yield "a tensor added", _npz({**good, "extra.npy": npy(np.zeros(3, np.float32))})
    yield "two tensors swapped", _npz({**good, "fc.bias.npy": good["rot.npy"], "rot.npy": good["fc.bias.npy"]})
    yield "a nested archive", _npz({name: _npz(good)})
    for key, value in kept.items():
        yield f"{key} zeros", _npz({**good, f"{key}.npy": npy(np.zeros_like(value))})
        shuffled = value.copy().reshape(-1)
        rng.shuffle(shuffled)
        yield f"{key} shuffled", _npz({**good, f"{key}.npy": npy(shuffled.reshape(value.shape))})
        flipped = value.copy()
        flipped.reshape(-1).view(np.uint8)[rng.randrange(flipped.nbytes)] ^= 1 << rng.randrange(8)
        yield f"{key} one bit flipped", _npz({**good, f"{key}.npy": npy(flipped)})
    data = _npz(good)
    while True:
        yield "mutated bytes", _mutated(data, rng)


def snapshot(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """Parameter snapshots and sketches (see the module)."""
    import numpy as np

    from torchrepro.analysis.divergence import load_sketch, load_snapshot
    from torchrepro.eventlog.snapshot_files import MAX_SNAPSHOT_BYTES

    folder = root / "snapshots"
    log, kept = _base_run(folder)
    secret = root / "secret.txt"
    secret.write_text("a private file")
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    target, sketch = folder / "step-0000002.npz", folder / "sketch-0000002.npz"
    reference = load_sketch(sketch, log)
    counts = {"clean": 0, "damage": 0, "not compared": 0}

    def cases() -> Iterator[tuple[str, Path, Callable[[], None]]]:
        for path in (target, sketch):
            for what, make in file_cases(path, secret, MAX_SNAPSHOT_BYTES):
                if what != "missing":
                    yield f"{path.name}: {what}", path, make
        for what, data in _snapshot_cases(kept, rng):
            yield what, target, lambda data=data: target.write_bytes(data)

    for i, (what, path, make) in enumerate(cases()):
        if i >= n:
            break
        for child in folder.iterdir():
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        if i % 3 == 1:  # the sketch beside it gone: the step log alone holds the fingerprints
            sketch.unlink()
        make()
        signal.alarm(CASE_S)
        try:
            got = None
            try:
                got = load_snapshot(target, log)
            except InputError as exc:
                _one_line(exc, folder)
                counts["damage"] += 1
            else:
                if got is None:
                    counts["not compared"] += 1
                else:  # accepted: bit for bit what the run recorded
                    assert got.keys() == kept.keys(), (what, sorted(got))
                    assert all(np.array_equal(got[k], kept[k]) and got[k].dtype == kept[k].dtype for k in kept), what
                    counts["clean"] += 1
            if path == sketch and sketch.exists() and i % 2 == 0:
                try:
                    read = load_sketch(sketch, log)
                except InputError as exc:
                    _one_line(exc, folder)
                else:
                    assert read.fps == reference.fps and read.names == reference.names, what
        except BaseException as exc:
            raise AssertionError(f"case {i} ({what}): {type(exc).__name__}: {exc}") from exc
        finally:
            signal.alarm(0)
    return counts


# --- the folder repro writes ------------------------------------------------------------------------


def output(root: Path, n: int, rng: random.Random) -> dict[str, int]:
    """The output folder in every state (see the module)."""
    import shutil

    from torchrepro.eventlog.output_guard import output_folder

    names = ["graph.py", "meta.json", "repro.py"]
    victims = root / "victims"

    def state() -> dict[str, tuple[bytes, int]]:
        return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in victims.rglob("*") if p.is_file()}

    def entry(path: Path, kind: str) -> None:
        if kind == "file":
            path.write_text("an earlier file")
        elif kind == "link to a victim":
            path.symlink_to(victims / "bashrc")
        elif kind == "dangling link":
            path.symlink_to(victims / "new-file")
        elif kind == "link to a folder":
            path.symlink_to(victims)
        elif kind == "FIFO":
            os.mkfifo(path)
        elif kind == "folder":
            path.mkdir()

    kinds = ["none", "file", "link to a victim", "dangling link", "link to a folder", "FIFO", "folder"]
    counts = {"clean": 0, "damage": 0}
    for i in range(n):
        shutil.rmtree(root / "case", ignore_errors=True)
        shutil.rmtree(victims, ignore_errors=True)
        victims.mkdir()
        (victims / "bashrc").write_text("the user's own file")
        (victims / "train.py").write_text("the training script")
        case = root / "case"
        case.mkdir()
        out = case / "repro"
        itself = rng.choice(["missing", "folder", "folder", "folder", "file", "link to a folder", "dangling link"])
        if itself == "folder":
            out.mkdir()
            for name in [*names, "other"]:
                if (kind := rng.choice(kinds)) != "none":
                    entry(out / name, kind)
        elif itself != "missing":
            entry(out, itself)
        force = rng.random() < 0.5
        inputs = [victims / "train.py"] + ([out / "graph.py"] if rng.random() < 0.1 else [])
        before = state()
        signal.alarm(CASE_S)
        try:
            with output_folder(out, names, inputs=inputs, force=force) as folder:
                for name in names:
                    folder.write(name, f"new {name}".encode())
            assert not out.is_symlink() and all((out / k).read_text() == f"new {k}" for k in names), (itself, force)
            assert not any((out / k).is_symlink() for k in os.listdir(out)), itself
            counts["clean"] += 1
        except InputError as exc:
            _one_line(exc, out)
            counts["damage"] += 1
        except BaseException as exc:
            raise AssertionError(f"case {i} ({itself}, force {force}): {type(exc).__name__}: {exc}") from exc
        finally:
            signal.alarm(0)
        assert state() == before, f"case {i} ({itself}, force {force}): a file outside the output folder changed"
    return counts


KINDS = {"graph": graph, "snapshot": snapshot, "output": output}


def main() -> None:
    kind, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.path.insert(0, str(Path(__file__).parent))
    signal.signal(signal.SIGALRM, _alarm)
    start = time.perf_counter()
    memory = Path("/dev/shm")  # the same files written again and again: in memory where there is one
    with tempfile.TemporaryDirectory(dir=memory if memory.is_dir() else None) as tmp:
        os.chdir(tmp)  # where a graph.py run at import would leave its marker
        counts = KINDS[kind](Path(tmp), n, random.Random(seed))
    print(json.dumps({**counts, "seconds": round(time.perf_counter() - start, 2)}))


if __name__ == "__main__":
    main()
