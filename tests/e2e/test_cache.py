"""`torchrepro cache`: status on a real cache, explain-miss on real runs, pack/unpack giving a real
warm start, cache policies per rank, and bad input (malicious or damaged packs) that must leave
the target untouched."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from torchrepro.cli import main
from torchrepro.eventlog.event_writer import write_all
from torchrepro.eventlog.events import CacheLookup, Header

pytestmark = pytest.mark.xdist_group("cache")  # one worker runs these tests: it builds the shared fixture once

SCRIPTS = Path(__file__).parents[1] / "scripts"
TINY = SCRIPTS / "cache_tiny.py"


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def run(*cmd, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCHREPRO_CACHE")}
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=300, env={**full, **env}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def counters_of(proc: subprocess.CompletedProcess) -> dict:
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def snapshot(directory: Path) -> dict[str, tuple]:
    """Everything under ``directory``: names, kinds, mtimes and hashes."""
    return {
        str(p.relative_to(directory)): (
            p.is_dir(),
            p.stat().st_mtime_ns,
            None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in directory.rglob("*")
    }


# ---------------------------------------------------------------- real compiles (one isolated cache)


@pytest.fixture(scope="session")  # not rebuilt when the worker runs other modules' tests in between
def compiled(tmp_path_factory):
    """Two real `torchrepro doctor` runs of a tiny inductor script sharing one isolated cache
    directory, the first with OMP_NUM_THREADS=1, the second with 2, on "machine A": a TMPDIR of
    its own, so that inductor's precompiled headers (kept in its default directory under TMPDIR)
    are built there too."""
    root = tmp_path_factory.mktemp("cache-real")
    cache, machine = root / "inductor", root / "machine-a"
    machine.mkdir()
    runs = {}
    for threads in ("1", "2"):
        out = root / f"run-{threads}t"
        run(
            sys.executable,
            "-m",
            "torchrepro",
            "doctor",
            "--out",
            out,
            TINY,
            cwd=root,
            env={"TORCHINDUCTOR_CACHE_DIR": str(cache), "OMP_NUM_THREADS": threads, "TMPDIR": str(machine)},
        )
        runs[threads] = out
    [headers] = machine.glob("torchinductor_*/precompiled_headers")
    return SimpleNamespace(root=root, cache=cache, headers=headers, run1=runs["1"], run2=runs["2"])


def _report_cache(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())["compile"]["cache"]


@pytest.mark.inductor
@pytest.mark.slow  # a cold inductor compile (~35 s) for the two tests of real cache entries; `make test` has status, clear and verify on built entries
def test_status_counts_what_the_runs_wrote(compiled, capsys):
    code, out, _ = cli(capsys, "cache", "status", compiled.cache, "--json")
    assert code == 0
    report = json.loads(out)
    cats = report["categories"]
    misses = {
        name: sum(_report_cache(r)[name]["miss"] for r in (compiled.run1, compiled.run2))
        for name in ("fxgraph", "aotautograd")
    }
    # every miss compiled and saved one entry: the inventory must find exactly those
    assert cats["fxgraph"]["files"] == misses["fxgraph"] == 4
    assert cats["aotautograd"]["files"] == misses["aotautograd"] == 2
    so_files = list(compiled.cache.glob("*/*.so"))
    assert so_files and cats["cpp"]["files"] == len(so_files) + len(list(compiled.cache.glob("*/*.cpp")))
    assert report["written_by"]["torch"] == {torch.__version__: 4}
    assert report["totals"]["unreachable_files"] == 0 and report["findings"] == []
    code, out, _ = cli(capsys, "cache", "status", compiled.cache)
    assert code == 0 and "fxgraph" in out and "no findings" in out


@pytest.mark.inductor
@pytest.mark.slow  # the same inductor runs as the test above
def test_explain_miss_names_the_thread_count(compiled, capsys):
    code, out, _ = cli(capsys, "cache", "explain-miss", compiled.run1, compiled.run2, "--json")
    assert code == 1  # the keys differ
    result = json.loads(out)
    [cause] = result["causes"]
    assert cause["component"] == "cpp_runtime_thread_count" and (cause["a"], cause["b"]) == ("1", "2")
    assert len(cause["lookups"]) == 3  # forward and backward FX graphs, and the AOTAutograd entry
    code, out, _ = cli(capsys, "cache", "explain-miss", compiled.run1, compiled.run2)
    assert "CPU thread count" in out and "OMP_NUM_THREADS" in out
    code, out, _ = cli(capsys, "cache", "explain-miss", compiled.run1, compiled.run1)
    assert code == 0 and "same keys" in out


@pytest.mark.inductor
@pytest.mark.slow  # moved out of `make test` for its time (TORCHREPRO_TEST_CPU_LOG); `make test-slow` runs it
def test_pack_gives_a_new_machine_a_warm_start_without_compiling(compiled, tmp_path, capsys):
    pack, key = tmp_path / "warm.tar", tmp_path / "key"
    assert cli(capsys, "cache", "keygen", key)[0] == 0
    packing = ("--from", compiled.cache, "--headers-from", compiled.headers, "--sign", key)
    assert cli(capsys, "cache", "pack", pack, *packing)[0] == 0
    assert cli(capsys, "cache", "verify", pack)[0] == 0
    # "Machine B": an empty TMPDIR (no precompiled headers) and the documented per-rank flow in a
    # fresh process: prewarm (configure + unpack) rank 1's empty directory, then train.
    machine, root = tmp_path / "machine-b", tmp_path / "ranks"
    machine.mkdir()
    proc = run(
        sys.executable,
        TINY,
        pack,
        "per-rank",
        root,
        cwd=tmp_path,
        env={"RANK": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(machine), "TORCHREPRO_TRUSTED_KEYS": f"{key}.pub"},
    )
    counts = counters_of(proc)
    assert counts["cache_dir"] == str(root / "rank-1")
    assert counts["fx"] == {"hit": 2} and counts["aot"] == {"hit": 1}
    # truly warm: no kernel was rebuilt, and the precompiled headers are the packed ones, untouched
    assert {p.name for p in (root / "rank-1").glob("*/*.so")} == {p.name for p in compiled.cache.glob("*/*.so")}
    [headers] = machine.glob("torchinductor_*/precompiled_headers")

    def stamps(directory):  # a rebuilt header would have a new mtime (the pack keeps them, to the µs)
        return {p.name: round(p.stat().st_mtime, 4) for p in directory.iterdir() if p.is_file()}

    assert stamps(headers) == stamps(compiled.headers)
    code, out, _ = cli(
        capsys, "cache", "unpack", pack, "--into", root / "rank-1", "--headers-into", headers, "--trusted", f"{key}.pub"
    )
    assert code == 0 and " 0 added" in out


# ---------------------------------------------------------------- explain-miss on crafted logs


def _lookup(rank, cid, cache, key, components, status="miss"):
    return CacheLookup(
        rank=rank,
        compile_id=cid,
        cache=cache,
        status=status,
        key=key,
        components=[{"hash": h, "what": w} for h, w in components],
    )


def _meta(index):
    return (
        f"TensorMetadata(dtype=torch.float32, shape=torch.Size([4, 8]), stride=(8, 1), "
        f"device=device(type='cuda', index={index}), layout=torch.strided, requires_grad=False)"
    )


def test_explain_miss_between_ranks_names_the_device_index(tmp_path, capsys):
    run_dir = tmp_path / "ddp"
    for rank in (0, 1):
        comps = [
            ("g1", "gm: GraphModule() def forward(self, x): ..."),
            (f"d{rank}", f"example_inputs[0]: {_meta(rank)}"),
            ("c1", "inductor_config[max_autotune]: False"),
        ]
        write_all(
            run_dir / f"rank-{rank}" / "events.jsonl",
            [
                Header(rank=rank),
                _lookup(rank, "0/0", "aotautograd", f"a{rank}", []),
                _lookup(rank, "0/0", "fxgraph", f"f{rank}", comps, status="hit" if rank == 0 else "miss"),
            ],
        )
    code, out, _ = cli(capsys, "cache", "explain-miss", run_dir, "--ranks", "0", "1", "--json")
    assert code == 1
    [cause] = json.loads(out)["causes"]
    assert cause["category"] == "device_index" and "cuda:0 vs cuda:1" in cause["detail"]
    assert "CUDA_VISIBLE_DEVICES" in cause["fix"] and len(cause["lookups"]) == 2  # the AOT lookup borrows it
    code, _, err = cli(capsys, "cache", "explain-miss", run_dir)
    assert code == 2 and err.startswith("torchrepro: error:") and "--ranks" in err


# ---------------------------------------------------------------- policies


@pytest.mark.slow  # moved out of `make test` for its time (TORCHREPRO_TEST_CPU_LOG); `make test-slow` runs it
def test_configure_sets_each_ranks_directories(run_python, tmp_path):
    code = f"""
import json, os, socket
import torchrepro.cache as cache
from torchrepro.errors import UserError
root = {str(tmp_path / "root")!r}
out = {{}}
for policy, env in [("per-rank", {{"RANK": "3"}}), ("shared", {{"RANK": "3"}}), ("per-node", {{"GROUP_RANK": "1"}}),
                    ("per-node", {{}})]:
    for k in ("RANK", "GROUP_RANK"):
        os.environ.pop(k, None)
    os.environ.update(env)
    plan = cache.configure(policy, root=root)
    out[policy + str(env)] = [os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"],
                              oct(os.stat(plan.inductor_dir).st_mode & 0o777)]
out["host"] = socket.gethostname()
import torch
torch.compile(lambda x: x * 2, backend="aot_eager")(torch.ones(2, requires_grad=True))
try:
    cache.configure("shared", root=root)
except UserError as exc:
    out["late"] = str(exc)
print(json.dumps(out))
"""
    out = json.loads(run_python(code).stdout.splitlines()[-1])
    root = tmp_path / "root"
    assert out["per-rank{'RANK': '3'}"] == [str(root / "rank-3"), str(root / "rank-3" / "triton"), "0o700"]
    assert out["shared{'RANK': '3'}"][:2] == [str(root), str(root / "triton")]
    assert out["per-node{'GROUP_RANK': '1'}"][0] == str(root / "node-1")
    assert out["per-node{}"][0] == str(root / f"node-{out['host']}")
    assert "before the first compile" in out["late"]


# ---------------------------------------------------------------- status, verify, clear on small caches


def fake_cache(root: Path, torch_version: str = torch.__version__) -> Path:
    """A small cache in inductor's layout (no compile needed): one FX entry, one AOT entry
    that needs it, a C++ kernel, a Python module and a lock."""
    key = "fab" + "c" * 49
    files = {
        f"fxgraph/ab/{key}/entry": b"\x80\x04" + f"# torch version: {torch_version}\n".encode() + b".",
        "aotautograd/akey/entry": b"\x80\x04\x8c\x34" + key.encode() + b".",
        "ab/cabc.cpp": b'extern "C" void kernel() {}\n',
        "ab/cabc.so": b"not an ELF file",
        "ab/cabmod.py": b"x = 1\n",
        "locks/cabc.lock": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_world_writable_cache_is_a_security_finding(tmp_path, capsys):
    cache = fake_cache(tmp_path / "c")
    cache.chmod(0o777)
    code, out, _ = cli(capsys, "cache", "status", cache, "--json")
    assert code == 1
    codes = [f["code"] for f in json.loads(out)["findings"]]
    assert codes[0] == "CACHE_WRITABLE_BY_OTHERS"
    cache.chmod(0o700)
    (cache / "ab" / "cabc.so").chmod(0o666)
    code, out, _ = cli(capsys, "cache", "status", cache)
    assert code == 1 and "can be changed by other users" in out
    (cache / "ab" / "cabc.so").chmod(0o644)
    (cache / "fxgraph").chmod(0o777)
    code, out, _ = cli(capsys, "cache", "status", cache, "--json")
    assert code == 1 and json.loads(out)["permissions"]["entries_writable_by_others"] == ["fxgraph/ (world-writable)"]


def test_entries_of_another_torch_are_unreachable_and_cleared(tmp_path, capsys):
    cache = fake_cache(tmp_path / "c", torch_version="1.13.0")
    code, out, _ = cli(capsys, "cache", "status", cache, "--json")
    report = json.loads(out)
    groups = {(g["category"], g["why"].split(" (")[0]) for g in report["unreachable"]}
    assert ("fxgraph", "written by torch 1.13.0") in groups
    assert any(g["category"] == "aotautograd" for g in report["unreachable"])  # its FX graph is stale
    assert report["findings"][0]["code"] == "CACHE_UNREACHABLE_ENTRIES"
    before = snapshot(cache)
    code, out, _ = cli(capsys, "cache", "clear", cache, "--stale")
    assert code == 0 and "would delete 2 files" in out and snapshot(cache) == before
    code, out, _ = cli(capsys, "cache", "clear", cache, "--stale", "--yes")
    assert code == 0 and not (cache / "fxgraph" / "ab").exists() and (cache / "ab" / "cabc.so").exists()
    code, out, _ = cli(capsys, "cache", "clear", cache, "--older-than", "1h", "--yes")
    assert "deleted 0 files" in out and (cache / "ab" / "cabc.so").exists()


def test_clear_removes_the_probes_graphs_too_and_says_so_apart(tmp_path, capsys):
    from torchrepro.cache.layout import PROBE_GRAPHS_PREFIX
    from torchrepro.capture.graph_probe import STORED_GRAPHS

    assert STORED_GRAPHS.startswith(PROBE_GRAPHS_PREFIX)  # the folder the probe writes is the one clear knows
    cache = fake_cache(tmp_path / "c")
    for name in ("fab-1234.graph", "fab-1234.json"):
        (cache / STORED_GRAPHS).mkdir(exist_ok=True)
        (cache / STORED_GRAPHS / name).write_bytes(b"x" * 1000)
    (cache / "notes.txt").write_text("mine")
    code, out, _ = cli(capsys, "cache", "status", cache, "--json")
    assert json.loads(out)["categories"]["probe"]["files"] == 2
    code, out, _ = cli(capsys, "cache", "clear", cache)
    lines = out.splitlines()
    assert lines[0] == "left alone: 1 file(s) or link(s) that are not inductor cache entries: notes.txt", out
    assert lines[1].startswith("would delete 5 files (") and lines[1].endswith(
        ": aotautograd 1, cpp 2, fxgraph 1, python 1"
    )
    assert lines[2] == "would delete 2 of torchrepro's probe graphs (2.0 kB) beside them"
    code, out, _ = cli(capsys, "cache", "clear", cache, "--yes")
    assert code == 0 and "deleted 2 of torchrepro's probe graphs (2.0 kB) beside them" in out
    assert not any((cache / STORED_GRAPHS).iterdir()) and (cache / "notes.txt").exists()


def test_verify_finds_a_truncated_entry_in_a_directory(tmp_path, capsys):
    cache = fake_cache(tmp_path / "c")
    assert cli(capsys, "cache", "verify", cache)[0] == 0
    entry = next((cache / "fxgraph").rglob("entry"))
    entry.write_bytes(entry.read_bytes()[:-1])
    code, out, _ = cli(capsys, "cache", "verify", cache)
    assert code == 1 and "truncated" in out


@pytest.mark.parametrize("case", ["missing", "file", "not-a-cache"])
def test_status_and_clear_bad_directories(tmp_path, capsys, case):
    target = tmp_path / "x"
    if case == "file":
        target.write_text("x")
    elif case == "not-a-cache":
        (target / "notes").mkdir(parents=True)
        (target / "cache").mkdir()
        (target / "cache" / "keep.txt").write_text("mine")
    before = snapshot(tmp_path)
    command = ("clear", target, "--yes") if case == "not-a-cache" else ("status", target)
    code, out, err = cli(capsys, "cache", *command)
    assert code == 2 and err.startswith("torchrepro: error:") and len(err.strip().splitlines()) == 1
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any directory")
def test_unreadable_cache_dir_is_exit_2(tmp_path, capsys):
    cache = fake_cache(tmp_path / "c")
    cache.chmod(0)
    try:
        code, _, err = cli(capsys, "cache", "status", cache)
    finally:
        cache.chmod(0o700)
    assert code == 2 and "cannot read" in err


# ---------------------------------------------------------------- malicious and damaged packs


@pytest.fixture
def good_pack(tmp_path, capsys) -> Path:
    path = tmp_path / "good.tar"
    assert cli(capsys, "cache", "pack", path, "--no-headers", "--from", fake_cache(tmp_path / "source"))[0] == 0
    return path


def _members(pack: Path) -> tuple[dict, list[tuple[tarfile.TarInfo, bytes]]]:
    with tarfile.open(pack) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    return json.loads(members[0][1]), members[1:]


def _write(pack: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    with tarfile.open(pack, "w") as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("torchrepro-pack.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def _evil(kind: str, target: Path) -> tuple[tarfile.TarInfo, bytes | None]:
    names = {"dotdot": "headers/../../evil", "absolute": str(target.parent / "evil")}
    info = tarfile.TarInfo(names.get(kind, "cache/ab/evil"))
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, "cache/ab/cabc.so"
    elif kind == "device":
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    else:
        data = b"pwned"
        info.size = len(data)
        return info, data
    return info, None


def _damage(case: str, good: Path, bad: Path, target: Path) -> None:
    if case == "truncated":  # cut inside the biggest file's data
        biggest = max(_members(good)[1], key=lambda m: m[0].size)[0]
        bad.write_bytes(good.read_bytes()[: biggest.offset_data + biggest.size // 2])
        return
    if case == "not-a-tar":
        bad.write_bytes(b"just some bytes" * 100)
        return
    manifest, members = _members(good)
    if case == "hash":
        info, data = members[-1]
        members[-1] = (info, bytes([data[0] ^ 1]) + data[1:])
    elif case == "other-torch":
        manifest["build"]["torch"] = "1.13.0"
    else:
        info, data = _evil(case, target)
        area, _, rel = info.name.partition("/")
        manifest["files"].append(
            {
                "area": area if area in ("cache", "headers") else "cache",
                "path": rel,
                "size": info.size,
                "mtime": 0,
                "sha256": hashlib.sha256(data or b"").hexdigest(),
            }
        )
        members.append((info, data))
    _write(bad, manifest, members)


@pytest.mark.parametrize("into", ["existing", "new"])
@pytest.mark.parametrize(
    "case", ["truncated", "not-a-tar", "hash", "other-torch", "dotdot", "absolute", "symlink", "hardlink", "device"]
)
def test_bad_pack_is_refused_and_changes_nothing(tmp_path, good_pack, capsys, case, into):
    target = tmp_path / "target" / "cache"
    if into == "existing":
        fake_cache(target)
        (target / "ab" / "cabc.so").write_bytes(b"mine")
    target.parent.mkdir(exist_ok=True)
    bad = tmp_path / "bad.tar"
    _damage(case, good_pack, bad, target)
    before = snapshot(target.parent)  # the target, and no staging directory left next to it
    code, _, err = cli(capsys, "cache", "unpack", bad, "--into", target, "--allow-unsigned")  # not about signing
    assert code == 2, err
    assert err.startswith("torchrepro: error:") and len(err.strip().splitlines()) == 1
    assert "nothing was unpacked" in err or case == "not-a-tar"
    assert snapshot(target.parent) == before
    assert not (tmp_path / "evil").exists() and not (target.parent / "evil").exists()
    if case == "other-torch":
        assert "torch 1.13.0" in err and "--force" in err
        assert cli(capsys, "cache", "unpack", bad, "--into", target, "--force", "--allow-unsigned")[0] == 0
    if case in ("hash", "dotdot", "symlink", "truncated"):
        code, out, _ = cli(capsys, "cache", "verify", bad)
        assert code == 1 and "damaged" in out


def test_unpack_keeps_newer_files_and_replaces_older_ones(tmp_path, good_pack, capsys):
    target = tmp_path / "t"
    fake_cache(target)
    newer, older = target / "ab" / "cabc.so", target / "ab" / "cabc.cpp"
    newer.write_bytes(b"rebuilt later")
    older.write_bytes(b"stale")
    os.utime(older, (1, 1))
    code, out, _ = cli(capsys, "cache", "unpack", good_pack, "--into", target, "--allow-unsigned")
    assert code == 0 and "1 older replaced" in out
    assert newer.read_bytes() == b"rebuilt later"
    assert older.read_bytes() == (tmp_path / "source" / "ab" / "cabc.cpp").read_bytes()


def test_pack_refuses_to_overwrite(tmp_path, good_pack, capsys):
    before = good_pack.read_bytes()
    code, _, err = cli(capsys, "cache", "pack", good_pack, "--no-headers", "--from", tmp_path / "source")
    assert code == 2 and "--force" in err and good_pack.read_bytes() == before


@pytest.mark.inductor
@pytest.mark.slow  # two checks of an inductor-compiled script, cold compiles (~2-3 min on 2 busy cores)
def test_check_blames_no_cache_setup_for_the_misses_its_own_runs_and_probe_made(tmp_path):
    """A check's two runs compile side by side: run 2 looks up the keys run 1 is still compiling, and
    misses; with a cache a plain run warmed, the graph probe (which keeps a copy of each graph it
    probes) compiles again what the cache served. Neither is the cache setup's fault."""

    def check(cache: Path, out: str) -> dict:
        env = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
        proc = run(sys.executable, "-m", "torchrepro", "check", "--out", out, TINY, env=env, cwd=tmp_path)
        report = json.loads((tmp_path / out / "report.json").read_text())
        assert report["determinism"]["verdict"] == "bit_exact" and report["exit_code"] == 0, proc.stdout
        codes = [f["code"] for f in report["findings"]]
        assert "CACHE_SAME_KEY_MISSED" not in codes, report["findings"]
        return next(f for f in report["findings"] if f["code"] == "CACHE_MISSED_BY_TORCHREPRO")

    cold = check(tmp_path / "cold", "c1")
    assert cold["evidence"]["beside"] >= 1 and "ran side by side" in cold["title"]
    warm = tmp_path / "warm"
    run(sys.executable, TINY, env={"TORCHINDUCTOR_CACHE_DIR": str(warm)}, cwd=tmp_path)  # no probe: no graph kept
    probed = check(warm, "c2")
    assert probed["evidence"]["probe"] >= 1 and "graph probe made misses" in probed["title"]
