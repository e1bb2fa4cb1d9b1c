"""Telemetry never holds the job: a collector that accepts the connection and never answers, or
refuses it, costs one warning line and a bounded delay; the standard OTEL_EXPORTER_OTLP_*ENDPOINT
variables turn export on as ``--otlp-endpoint`` does. Real sockets on loopback, real CLI runs."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk")
from test_otel import TRAIN, _cli, _env, _free_port, _warnings, receiver  # noqa: F401 - receiver: a fixture

# What a failing collector may add to a command: the exporter's import, one bounded export (otel.py:
# END_FLUSH_S 3 s at the end), where the SDK's own timeout would cost 10 s an export and more with
# retries; 6 s, not less: two runs of the same doctor differ by 4 s beside the rest of the suite on 2 cores.
SLACK_S = 6.0


def _least_added(pair: Callable[[int], tuple[float, float]]) -> tuple[float, float]:
    """(seconds with the failing collector, without) of ``pair(i)``, measured again once when the
    first pair differs by more than SLACK_S: another job on the machine only adds time, so the
    pair that differs less is the nearer to what the collector costs."""
    first = pair(0)
    if first[0] - first[1] < SLACK_S:
        return first
    return min(first, pair(1), key=lambda took: took[0] - took[1])


class SilentCollector:
    """A TCP listener on loopback that accepts every connection and never reads or answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self):
        while not self._stop.is_set():
            try:
                self.accepted.append(self.sock.accept()[0])
            except (TimeoutError, OSError):
                continue

    def close(self):
        self._stop.set()
        self.thread.join()
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent():
    collector = SilentCollector()
    yield collector
    collector.close()


@pytest.fixture(scope="session")  # made once: its tests share a worker (xdist_group "telemetry-stored")
def stored_run(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("stored")
    proc = _cli(tmp, "doctor", "--out", str(tmp / "run"), str(TRAIN), "--", "--backend", "eager")
    assert (tmp / "run" / "rank-0" / "events.jsonl").exists(), proc.stderr[-2000:]
    return tmp / "run"


def _timed(cwd: Path, *args: str, env: dict[str, str] | None = None):
    start = time.monotonic()
    proc = _cli(cwd, *args, env=env, timeout=120)
    return proc, time.monotonic() - start


@pytest.mark.xdist_group("telemetry-stored")
@pytest.mark.parametrize("kind", ["silent", "refused"])
def test_failing_collector_costs_report_one_warning_and_seconds(tmp_path, stored_run, silent, kind):
    url = silent.url if kind == "silent" else f"http://127.0.0.1:{_free_port()}"
    runs: list[tuple] = []

    def pair(i: int) -> tuple[float, float]:
        plain = _timed(tmp_path, "report", str(stored_run))
        failing = _timed(tmp_path, "report", str(stored_run), "--otlp-endpoint", url)
        runs.append((plain[0], failing[0]))
        return failing[1], plain[1]

    took, plain_s = _least_added(pair)
    plain, proc = runs[0]
    assert proc.returncode == plain.returncode, proc.stderr[-2000:]
    (warning,) = _warnings(proc.stderr)
    assert url in warning
    assert "Traceback" not in proc.stderr
    assert took < plain_s + SLACK_S, (took, plain_s)
    if kind == "silent":
        assert silent.accepted  # the exporter did reach it: the time bound is the exporter's, not a refusal


@pytest.mark.slow  # moved out of `make test` for its time (TORCHREPRO_TEST_CPU_LOG); `make test-slow` runs it
def test_silent_collector_costs_doctor_one_warning_and_seconds(tmp_path, silent, receiver):  # noqa: F811
    """Against the same doctor exporting to a collector that answers: both processes (the launcher,
    the rank) import and set up the exporter either way; the silent one may add its bounded export."""
    args = [str(TRAIN), "--", "--backend", "eager", "--epochs", "1"]
    runs: list[tuple] = []

    def pair(i: int) -> tuple[float, float]:
        plain = _timed(tmp_path, "doctor", "--out", str(tmp_path / f"plain{i}"), "--otlp-endpoint", receiver.url, *args)
        failing = _timed(tmp_path, "doctor", "--out", str(tmp_path / f"run{i}"), "--otlp-endpoint", silent.url, *args)
        runs.append((plain[0], failing[0]))
        return failing[1], plain[1]

    took, plain_s = _least_added(pair)
    plain, proc = runs[0]
    assert proc.returncode == plain.returncode, proc.stderr[-2000:]
    assert not _warnings(plain.stderr), plain.stderr[-2000:]
    (warning,) = _warnings(proc.stderr)  # launcher and rank both failed: one line for the job
    assert silent.url in warning
    assert took < plain_s + SLACK_S, (took, plain_s)


@pytest.mark.xdist_group("telemetry-stored")
@pytest.mark.parametrize("var", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "flag_wins"])
def test_env_endpoint_turns_export_on(tmp_path, stored_run, receiver, var):  # noqa: F811 - the fixture
    if var == "flag_wins":  # the variable names a port nobody listens on; the flag, the receiver
        env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{_free_port()}")
        proc = _cli(tmp_path, "report", str(stored_run), "--otlp-endpoint", receiver.url, env=env)
    else:
        url = receiver.url + ("/v1/traces" if "TRACES" in var else "")
        proc = _cli(tmp_path, "report", str(stored_run), env=_env(**{var: url}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not _warnings(proc.stderr), proc.stderr[-2000:]
    names = {s["name"] for s in receiver.spans()}
    assert {"torchrepro report", "torchrepro rank", "torch.compile"} <= names
    assert receiver.metric("torchrepro.compiles")  # metrics too: the base URL without /v1/traces


@pytest.mark.xdist_group("telemetry-stored")
def test_malformed_env_endpoint_is_one_line_exit_2(tmp_path, stored_run):
    proc = _cli(tmp_path, "report", str(stored_run), env=_env(OTEL_EXPORTER_OTLP_ENDPOINT="localhost:4318"))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("torchrepro: error: OTEL_EXPORTER_OTLP_ENDPOINT:") and "http(s) URL" in line
    assert not list(tmp_path.iterdir())  # nothing was written


def test_drift_on_an_unreachable_ray_cluster_is_one_line_exit_2(tmp_path):
    pytest.importorskip("ray", reason="Ray is not installed (the torchrepro[ray] extra)")
    address = f"127.0.0.1:{_free_port()}"  # nothing listens: refused
    start = time.monotonic()
    proc = _cli(
        tmp_path,
        "drift",
        "--launcher",
        "ray",
        "--vary",
        "compile",
        "--runs",
        "2",
        "--out",
        "exp",
        str(TRAIN.parent / "drift_toy.py"),
        env=_env(RAY_ADDRESS=address),
        timeout=120,
    )
    assert time.monotonic() - start < 30  # Ray alone retries for minutes
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert errors == [
        f"torchrepro: error: --launcher ray: the Ray cluster at RAY_ADDRESS={address} is unreachable "
        "(Connection refused)"
    ]
    assert "Traceback" not in proc.stderr
