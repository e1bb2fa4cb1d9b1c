"""Shared setup of both tiers (tests/unit/, tests/e2e/; docs/architecture.md, "Tests"): one
inductor cache for the whole run (cold compiles cost 10-20 s); no process a test starts outlives
it; every report a test writes is checked against the JSON Schema of its kind.

Besides the tiers, a marker: `make test` runs every test not marked ``slow``; `make test-slow` runs
those (CI runs both). Mark ``slow`` an end-to-end case whose processes cost tens of seconds of CPU
(several ranks, many runs, inductor) when a cheaper test in `make test` covers the same code path.
Runs that several tests only read are made once: a session fixture (tests/e2e/conftest.py), its
tests in one xdist_group."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

from support import schema_problems

# Set before anything imports torch._inductor; subprocesses started by tests inherit it.
_CACHE = Path(tempfile.gettempdir()) / f"torchrepro-test-inductor-{os.getuid()}"
_CACHE.mkdir(mode=0o700, exist_ok=True)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_CACHE))


# Every process a test starts inherits this token, so one that outlives its test is found even
# after it was reparented away from pytest.
_TOKEN = f"TORCHREPRO_TEST_SESSION={os.getpid()}-{time.time_ns()}"
os.environ["TORCHREPRO_TEST_SESSION"] = _TOKEN.split("=", 1)[1]


def _marked_processes() -> dict[int, str]:
    """Running processes (not zombies) started under this pytest session, except pytest itself,
    inductor's compile workers (a pool pytest's own process keeps across tests) and the guardian of
    pytest's process (commands/_guardian.py, started by the first job a test launches in-process,
    kept until pytest ends)."""
    found = {}
    token = _TOKEN.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if token not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != "Z" and "compile_worker" not in cmdline and not cmdline.endswith(f"_guardian.py {os.getpid()} "):
            found[int(entry)] = cmdline.strip()
    return found


@pytest.fixture(autouse=True)
def no_process_outlives_its_test():
    """Fail a test that leaves a process running (then end it, so the next test starts clean)."""
    before = set(_marked_processes())
    yield
    deadline = time.monotonic() + 10
    while (left := {p: c for p, c in _marked_processes().items() if p not in before}) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes outlived the test: {left}"


@pytest.fixture(autouse=True)
def idle_threads_sleep(request, monkeypatch):
    """The processes a test of `make test` starts share the cores with the other worker's: their idle
    OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE, as torchrepro gives runs that share the cores,
    launcher.SHARING_CORES_ENV) instead of spinning on CPU the other worker needs. How an idle thread
    waits changes neither the number of threads nor how an op splits its work (test_side_by_side.py),
    only the CPU spent waiting. The slow tier keeps the environment as it is: its races between a
    run's own threads need them running at once. Where the environment sets the variable, it stands."""
    if "OMP_WAIT_POLICY" not in os.environ and request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(autouse=True)
def reports_match_their_schema(request):
    """After a test, every torchrepro report under its ``tmp_path`` (``report.json``, ``--json``
    files) validates against the published JSON Schema of its kind (``torchrepro/reports/schemas``)."""
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is None or not root.is_dir():
        return
    problems = [f"{path}: {problem}" for path in sorted(root.rglob("*.json")) for problem in schema_problems(path)]
    assert not problems, "reports that break their schema:\n" + "\n".join(problems)


_CPU_LOG = os.environ.get("TORCHREPRO_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With TORCHREPRO_TEST_CPU_LOG=FILE, append each test's CPU seconds (its worker's and the
    processes it waited for), wall seconds and id to FILE: where the suite's time goes. Setup
    and teardown included, so a shared (session) fixture counts in the first test that uses it."""
    if not _CPU_LOG:
        yield
        return
    import resource

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    cpu0, wall0 = cpu(), time.monotonic()
    yield
    with open(_CPU_LOG, "a") as fp:
        fp.write(f"{cpu() - cpu0:.2f} {time.monotonic() - wall0:.2f} {item.nodeid}\n")


# The suite is CPU-bound on 2 workers: a long test handed out last keeps one worker busy while
# the other idles. xdist hands tests out in collection order, so the modules with the longest
# tests (or group fixtures, e.g. test_compiled_nondeterminism's 70 s GPT check) go first,
# heaviest first (measured with TORCHREPRO_TEST_CPU_LOG); the rest keep their order.
_HEAVY_FIRST = (
    "test_compiled_nondeterminism.py",
    "test_drift.py",
    "test_cache.py",
    "test_follow_check.py",
    "test_launchers.py",
    "test_resume.py",
    "test_check.py",
    "test_verdicts.py",
    "test_otel.py",
    "test_distributed.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
