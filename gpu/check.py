"""`make gpu`: what torchrepro claims on CUDA, checked on one CUDA GPU in a few minutes.

Each check runs the real command line (``python -m torchrepro ...``) on a small script in
``gpu/scripts/``, as a user would, and prints one line: PASS, FAIL or SKIP, the check's name and
what was measured. The exit status is 1 when any check failed, 0 otherwise; 2 when there is no
CUDA device (one line, nothing checked) or the arguments are wrong. docs/evidence/gpu.md says what each
check proves and holds the results table.

    python gpu/check.py [--only NAME,NAME] [--list] [--work DIR] [--timeout S]

The work directory (default: a new temporary one) holds every run directory, report and cache the
checks made; it is removed when every check passed and kept, and named, otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

from torchrepro.commands.options import positive_float
from torchrepro.render.sanitize import visible

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
STATUSES = ("PASS", "FAIL", "SKIP")
NAME_WIDTH = 20


@dataclass
class Result:
    """What one check found: its status, and the measurement or reason in one line."""

    name: str
    status: str
    detail: str
    seconds: float | None = None


def format_line(result: Result) -> str:
    """``PASS  cuda-rng-resume       BIT-EXACT resume ... (31.2 s)``: one line, whatever the detail holds."""
    if result.status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {result.status!r}")
    # a newline never splits the line; control characters from a script's output are shown as escapes
    detail = visible(" ".join(result.detail.split()))
    took = f" ({result.seconds:.1f} s)" if result.seconds is not None else ""
    return f"{result.status:<4}  {result.name:<{NAME_WIDTH}}  {detail}{took}"


class CheckFailed(Exception):
    """A check's expectation did not hold: its message is the FAIL line's detail."""


class CheckSkipped(Exception):
    """A check could not run here (what it needs is missing): its message is the SKIP line's detail."""


class Context:
    """Where a check works, and how it runs torchrepro and the scripts."""

    def __init__(self, work: Path, timeout: float) -> None:
        self.work = work
        self.timeout = timeout
        # one inductor cache for the whole run (the cache check makes its own), Triton's inside it
        self.env = {k: v for k, v in os.environ.items() if k not in ("TRITON_CACHE_DIR", "CUBLAS_WORKSPACE_CONFIG")}
        self.env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")

    def run(
        self, argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` run to its end (a timeout is a failed check); stdout and stderr kept."""
        try:
            return subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env={**self.env, **(env or {})},
                cwd=cwd or self.work,
            )
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"timed out after {self.timeout:.0f} s: {' '.join(argv[-3:])}") from None

    def torchrepro(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "torchrepro", *args], env=env)

    def script(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, str(SCRIPTS / name), *args], env=env)


def _why(proc: subprocess.CompletedProcess[str], run_dir: Path | None = None) -> str:
    """The most telling line of a command that ended unexpectedly: the last error a run under
    ``run_dir`` recorded from the script (``run.json``'s ``stderr_tail``), else the command's last line."""
    for meta in sorted(run_dir.rglob("run.json")) if run_dir is not None and run_dir.is_dir() else []:
        try:
            tail = json.loads(meta.read_text()).get("stderr_tail") or []
        except (OSError, ValueError):
            continue
        errors = [line.strip() for line in tail if re.search(r"\w(Error|Exception)\b", line)]
        if errors:
            return f"{meta.parent.name}: {errors[-1]}"
    lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no output)"


def _expect(
    proc: subprocess.CompletedProcess[str], codes: tuple[int, ...], what: str, run_dir: Path | None = None
) -> None:
    if proc.returncode not in codes:
        raise CheckFailed(f"{what} exited {proc.returncode}: {_why(proc, run_dir)}")


def _report(run_dir: Path) -> dict:
    path = run_dir / "report.json"
    if not path.is_file():
        raise CheckFailed(f"no report at {path}")
    return json.loads(path.read_text())


def _json_file(path: Path, what: str) -> dict:
    if not path.is_file():
        raise CheckFailed(f"{what} wrote no {path.name}")
    return json.loads(path.read_text())


# --- the checks --------------------------------------------------------------------------------


def check_rng_resume(ctx: Context) -> str:
    """check-resume on a CUDA script whose only randomness is CUDA dropout: bit-exact; and with the
    saved RNG states not restored, not bit-exact (so the CUDA generator's state is what was saved)."""
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    verdicts = {}
    for label, extra in (("restored", []), ("forgotten", ["--forget-rng"])):
        run_dir = ctx.work / f"resume-{label}"
        proc = ctx.torchrepro(
            "check-resume", "--at", "3", "--out", str(run_dir), str(SCRIPTS / "rng_resume.py"), "--", *extra, env=env
        )
        _expect(proc, (0, 1), f"check-resume ({label} RNG)", run_dir)
        verdicts[label] = _report(run_dir)["determinism"]
    kept, forgot = verdicts["restored"], verdicts["forgotten"]
    if kept["verdict"] != "bit_exact":
        raise CheckFailed(f"resume with the CUDA RNG restored is {kept['verdict']}, not bit_exact")
    if forgot["verdict"] != "diverged":
        raise CheckFailed(f"resume with the RNG state forgotten is {forgot['verdict']}: the CUDA state did not matter")
    cause = (forgot.get("first_divergence") or {}).get("cause")
    return (
        f"BIT-EXACT resume after step 3 ({kept.get('steps_compared')} steps compared); "
        f"RNG not restored: diverged (cause {cause})"
    )


def check_atomic_race(ctx: Context) -> str:
    """`torchrepro check` of an inductor-compiled index_add_ with many collisions: DIVERGED, cause
    nondeterministic_op, localised to the compiled graph and the accumulating op."""
    run_dir = ctx.work / "atomic-race"
    proc = ctx.torchrepro("check", "--no-fixes", "--out", str(run_dir), str(SCRIPTS / "atomic_race.py"))
    if not (run_dir / "report.json").is_file():
        _expect(proc, (), "check", run_dir)
    det = _report(run_dir)["determinism"]
    fd = det.get("first_divergence") or {}
    (ctx.work / "atomic-race.first_divergence.json").write_text(json.dumps(fd, indent=1))
    if det["verdict"] != "diverged" or fd.get("cause") != "nondeterministic_op":
        raise CheckFailed(
            f"verdict {det['verdict']}, cause {fd.get('cause')} (exit {proc.returncode}): expected diverged, nondeterministic_op"
        )
    op = str(fd.get("op") or "")
    if not any(name in op for name in ("index_add", "index_put", "scatter_add")):
        raise CheckFailed(f"diverged, but the op named is {op or 'none'}, not the accumulating index_add_")
    if not fd.get("compile_id"):
        raise CheckFailed(f"diverged at {op}, but no compiled graph named")
    return (
        f"DIVERGED at step {fd.get('step')}: nondeterministic_op, compiled graph {fd.get('compile_id')} "
        f"({fd.get('graph')}), node {fd.get('node')}, op {op}, kernel {fd.get('kernel') or 'not named'}"
    )


def check_atomic_kernel(ctx: Context) -> str:
    """The same divergence names the Triton kernel that accumulates with atomic adds."""
    path = ctx.work / "atomic-race.first_divergence.json"
    if not path.is_file():
        raise CheckSkipped("atomic-race wrote no first divergence to read")
    fd = json.loads(path.read_text())
    kernel = fd.get("kernel")
    if not kernel:
        raise CheckFailed(f"no kernel named (graph {fd.get('compile_id')}, node {fd.get('node')}, op {fd.get('op')})")
    if not str(kernel).startswith("triton_"):
        raise CheckFailed(f"kernel {kernel} named, not a Triton kernel")
    evidence = fd.get("evidence") or {}
    return f"{kernel} (atomic adds: {evidence.get('kernel_atomic_add')})"


def _cublas_row(proc: subprocess.CompletedProcess[str]) -> dict:
    (row,) = [s for s in json.loads(proc.stdout)["determinism"] if s["name"] == "CUBLAS_WORKSPACE_CONFIG"]
    return row


def check_cublas_audit(ctx: Context) -> str:
    """`torchrepro env` flags an unset CUBLAS_WORKSPACE_CONFIG as a risk and accepts :4096:8; in a live
    process, deterministic() set before CUDA starts is in effect, set after it is a risk and warns."""
    unset = ctx.torchrepro("env", "--json")
    _expect(unset, (0,), "torchrepro env --json")
    fixed = ctx.torchrepro("env", "--json", env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    _expect(fixed, (0,), "torchrepro env --json (:4096:8)")
    a, b = _cublas_row(unset), _cublas_row(fixed)
    if a["status"] != "risk" or b["status"] != "ok":
        raise CheckFailed(f"env: unset is {a['status']} ({a['note']}), :4096:8 is {b['status']} ({b['note']})")
    live = ctx.script("cublas_late.py")
    _expect(live, (0,), "cublas_late.py")
    seen = json.loads(live.stdout.strip().splitlines()[-1])
    early, late = seen["before_init"], seen["after_init"]
    ours = [w for w in seen["before_init_warnings"] if w.startswith("DeterminismWarning")]
    if early["status"] != "ok" or ours:
        raise CheckFailed(f"deterministic() before CUDA init: {early['status']} ({early['note']}); {ours}")
    late_warned = any(
        w.startswith("DeterminismWarning: CUDA is already initialised") for w in seen["after_init_warnings"]
    )
    if late["status"] != "risk" or not late_warned:
        raise CheckFailed(f"deterministic() after CUDA init: {late['status']} ({late['note']}), no warning")
    if not seen["matmul_repeats"]:
        raise CheckFailed("two deterministic matmuls differ")
    return (
        f"env: unset {a['status']}, :4096:8 {b['status']}; deterministic() before CUDA init ok, after it risk + warning"
    )


def check_cudagraph_recompiles(ctx: Context) -> str:
    """doctor on a mode="reduce-overhead" loop whose batch size changes: its compiles, recompiles,
    graph breaks and unique graphs equal Dynamo's own counters in the same process."""
    run_dir = ctx.work / "reduce-overhead"
    counts = ctx.work / "reduce-overhead.dynamo.json"
    proc = ctx.torchrepro("doctor", "--out", str(run_dir), str(SCRIPTS / "cudagraph_recompiles.py"), "--", str(counts))
    _expect(proc, (0, 1), "doctor", run_dir)
    dynamo = _json_file(counts, "cudagraph_recompiles.py")
    compile_ = _report(run_dir)["compile"]
    ours = {k: compile_.get(k) for k in dynamo}
    if ours != dynamo:
        raise CheckFailed(f"doctor {ours} != Dynamo {dynamo}")
    if not dynamo["recompiles"]:
        raise CheckFailed(f"Dynamo recompiled nothing ({dynamo}): the check compared nothing")
    return ", ".join(f"{k} {v}" for k, v in dynamo.items()) + " (doctor = Dynamo)"


def check_cache_warm(ctx: Context) -> str:
    """A signed pack of a cold run's cache (Triton kernels included), unpacked into a fresh
    directory after its signature is checked: the next run hits every graph and its first step is faster."""
    cold, warm, pack, key = ctx.work / "cache-cold", ctx.work / "cache-warm", ctx.work / "warm.tar.gz", ctx.work / "key"
    first = ctx.script("cache_warm.py", str(ctx.work / "cache-cold.json"), env={"TORCHINDUCTOR_CACHE_DIR": str(cold)})
    _expect(first, (0,), "the cold run")
    status = ctx.torchrepro("cache", "status", str(cold), "--json")
    _expect(status, (0, 1), "cache status")
    triton = json.loads(status.stdout)["categories"].get("triton", {}).get("files", 0)
    if not triton:
        raise CheckFailed("the cold run left no Triton kernels in its cache directory")
    _expect(ctx.torchrepro("cache", "keygen", str(key)), (0,), "cache keygen")
    _expect(
        ctx.torchrepro("cache", "pack", str(pack), "--from", str(cold), "--no-headers", "--sign", str(key)),
        (0,),
        "cache pack --sign",
    )
    unpacked = ctx.torchrepro("cache", "unpack", str(pack), "--into", str(warm), "--trusted", f"{key}.pub")
    _expect(unpacked, (0,), "cache unpack --trusted")
    second = ctx.script("cache_warm.py", str(ctx.work / "cache-warm.json"), env={"TORCHINDUCTOR_CACHE_DIR": str(warm)})
    _expect(second, (0,), "the warm run")
    a = _json_file(ctx.work / "cache-cold.json", "the cold run")
    b = _json_file(ctx.work / "cache-warm.json", "the warm run")
    # an AOTAutograd hit loads its graphs without an FX-graph lookup: both caches count
    hits = {k: b[k].get("hit", 0) for k in ("fx", "aot")}
    misses = b["fx"].get("miss", 0) + b["aot"].get("miss", 0)
    if not sum(hits.values()) or misses:
        raise CheckFailed(f"warm run: hits {hits}, {misses} miss(es); cold run: {a['fx']}, {a['aot']}")
    if b["first_step_s"] >= a["first_step_s"]:
        raise CheckFailed(f"warm first step {b['first_step_s']:.2f} s, not below the cold {a['first_step_s']:.2f} s")
    return (
        f"first step {a['first_step_s']:.2f} s cold, {b['first_step_s']:.2f} s warm from the signed pack "
        f"({a['first_step_s'] / b['first_step_s']:.1f}x); hits: FX graph {hits['fx']}, AOTAutograd {hits['aot']}, "
        f"no miss; {triton} Triton file(s) packed"
    )


def check_sync_free(ctx: Context) -> str:
    """doctor over a compiled loop run under torch.cuda.set_sync_debug_mode("error"): capture adds
    no device synchronisation (the loop does not raise), and what doctor costs a step."""
    steps = "200"
    plain = ctx.script("sync_free_loop.py", str(ctx.work / "sync-plain.json"), steps)
    _expect(plain, (0,), "the loop without torchrepro")
    run_dir = ctx.work / "sync-doctor"
    timed = ctx.work / "sync-doctor.json"
    proc = ctx.torchrepro("doctor", "--out", str(run_dir), str(SCRIPTS / "sync_free_loop.py"), "--", str(timed), steps)
    _expect(proc, (0, 1), "doctor over the loop (a sync under capture raises)", run_dir)
    a, b = _json_file(ctx.work / "sync-plain.json", "the plain loop"), _json_file(timed, "the loop under doctor")
    report = _report(run_dir)
    recorded = report["steps"]["steps"]
    if recorded != b["steps"]:
        raise CheckFailed(f"doctor recorded {recorded} step(s) of {b['steps']}")
    cost_us = (b["step_ms"] - a["step_ms"]) * 1000
    return (
        f"no sync in {b['timed_steps']} captured steps; {recorded} steps recorded; step {a['step_ms']:.3f} ms plain, "
        f"{b['step_ms']:.3f} ms under doctor ({cost_us:+.0f} µs a step)"
    )


CHECKS: dict[str, tuple[Callable[[Context], str], str]] = {
    "cuda-rng-resume": (check_rng_resume, "check-resume bit-exact on CUDA dropout; not without the RNG state"),
    "atomic-race": (
        check_atomic_race,
        "check finds a compiled index_add_ race: DIVERGED, nondeterministic_op, graph, op",
    ),
    "atomic-race-kernel": (check_atomic_kernel, "that divergence names its Triton kernel"),
    "cublas-audit": (
        check_cublas_audit,
        "env and deterministic() on CUBLAS_WORKSPACE_CONFIG, before and after CUDA init",
    ),
    "cudagraph-recompiles": (check_cudagraph_recompiles, "doctor's counts on mode=\"reduce-overhead\" = Dynamo's"),
    "cache-warm-start": (check_cache_warm, "a signed pack with Triton kernels: hits and a faster first step"),
    "sync-free-capture": (check_sync_free, 'doctor under set_sync_debug_mode("error"): no sync added; cost a step'),
}


def run_checks(checks: dict[str, Callable[[Context], str]], ctx: Context, say: Callable[[str], None]) -> list[Result]:
    """Run each check, print its line as it ends; an exception is the check's FAIL, never a traceback."""
    results = []
    for name, check in checks.items():
        start = time.perf_counter()
        try:
            result = Result(name, "PASS", check(ctx))
        except CheckFailed as exc:
            result = Result(name, "FAIL", str(exc))
        except CheckSkipped as exc:
            result = Result(name, "SKIP", str(exc))
        except Exception as exc:  # a bug of the check or a changed report: still one line
            result = Result(name, "FAIL", f"{type(exc).__name__}: {exc}")
        result.seconds = time.perf_counter() - start
        say(format_line(result))
        results.append(result)
    return results


def exit_code(results: list[Result]) -> int:
    """1 when any check failed, else 0 (a skipped check fails nothing)."""
    return 1 if any(r.status == "FAIL" for r in results) else 0


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown check {', '.join(unknown) or '(none)'}; known: {', '.join(CHECKS)}")
    return names


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage error is one line and exit 2 (the usage itself is in --help)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = _Parser(
        prog="gpu/check.py",
        description="torchrepro's CUDA checks: one line per check, exit 1 on any FAIL, 2 without a CUDA device.",
    )
    p.add_argument("--only", type=_names, metavar="NAME,NAME", help="run only these checks (see --list)")
    p.add_argument("--list", action="store_true", help="name every check and what it proves, then exit")
    p.add_argument("--work", type=Path, metavar="DIR", help="keep every run here (default: a temporary directory)")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="S", help="limit per command (default 300)")
    return p.parse_args(argv)


def cuda_device() -> str | None:
    """The first CUDA device's name, or None (without creating a CUDA context)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name, (_, what) in CHECKS.items():
            print(f"{name:<{NAME_WIDTH}}  {what}")
        return 0
    import torch

    device = cuda_device()
    if device is None:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(
            format_line(Result("all", "SKIP", f"no CUDA device (torch {torch.__version__}, {build}): nothing checked"))
        )
        return 2
    names = args.only or list(CHECKS)
    if "atomic-race-kernel" in names and "atomic-race" not in names:
        names.insert(names.index("atomic-race-kernel"), "atomic-race")
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="torchrepro-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"gpu check on {device}; work directory {work}", flush=True)
    start = time.perf_counter()
    results = run_checks({n: CHECKS[n][0] for n in names}, Context(work, args.timeout), lambda s: print(s, flush=True))
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    code = exit_code(results)
    if code == 0 and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
        kept = ""
    else:
        kept = f"; runs kept in {work}"
    print(
        f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"in {time.perf_counter() - start:.0f} s{kept}"
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
