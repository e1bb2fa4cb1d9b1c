"""Record the corpus of ``TORCH_TRACE`` logs that ``tests/e2e/compat/test_trace_corpus.py`` reads: one
directory per torch version and scenario, ``tests/data/torch_traces/<torch version>/<scenario>/``.

Run it with the Python of the venv whose torch is to be recorded (any supported version)::

    .venv-compat-2.6.0/bin/python tests/e2e/compat/record_traces.py [--only dtype,autocast]

Each scenario of ``tests/e2e/test_doctor_scenarios.py`` runs as that suite runs it (in-process capture,
analysed by doctor), in one interpreter started with ``TORCH_TRACE`` set; before each scenario
torch's trace handler is pointed at a fresh directory, so every scenario has its own complete log.
Next to the log, ``live.json`` keeps what the live run reported (counts, each recompile's category,
limit hits), Dynamo's own counters and where this CPython keeps None (``none_offset``): the corpus test
asks ``doctor --trace`` for the same.

Kept small: only the records torchrepro reads stay (no ``chromium_event``, tensor descriptions or
graph code), the metrics records lose the configuration dumps they carry, and the log is gzipped
(``*.log.gz``, a few KB per scenario).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]
CORPUS = TESTS / "data" / "torch_traces"
# what the reader uses of each record (torchrepro.eventlog.structured_trace): the rest is dropped
KEPT_ARTIFACTS = re.compile(r"^(recompile_reasons|dynamo_graph_break_reason|(fx_graph|aotautograd)_cache_\w+)$")
BULKY_METRICS = ("inductor_config", "dynamo_config")
_RECORD = re.compile(r"^([A-Z]\d{4} [\d:.]+ +\d+ [^\]]*\] )(\{.*\})\s*$")
# where this CPython build keeps None from True: torch 2.6 guards both by identity, and a log read afterwards
# tells None replaced by a bool only where the reader's build keeps them as far apart (live.json says it)
NONE_OFFSET = id(None) - id(True)


def trim(log: Path) -> bytes:
    """The records of ``log`` torchrepro reads, as the same log format (payloads kept intact, so their
    MD5 still holds; a graph's code, never read, is dropped with its ``has_payload``)."""
    from torchrepro.eventlog.structured_trace import record_kind

    out: list[str] = []
    keep = False
    for line in log.read_text(encoding="utf-8").splitlines():
        if line.startswith("\t"):
            if keep:
                out.append(line)
            continue
        m = _RECORD.match(line)
        metadata = json.loads(m.group(2)) if m else {}
        kind = record_kind(metadata)
        if kind == "artifact":
            keep = bool(KEPT_ARTIFACTS.match(metadata["artifact"].get("name", "")))
        else:
            keep = kind in (
                "str",
                "dynamo_start",
                "dynamo_cpp_guards_str",
                "compilation_metrics",
                "bwd_compilation_metrics",
                "dynamo_output_graph",
            )
        if kind == "dynamo_output_graph":
            metadata.pop("has_payload", None)
            keep = False  # its payload (the graph's code) is not copied
            out.append(m.group(1) + json.dumps(metadata))
            continue
        for name in ("compilation_metrics", "bwd_compilation_metrics"):
            for bulky in BULKY_METRICS:
                metadata.get(name, {}).pop(bulky, None)
        if keep and m:
            out.append(m.group(1) + json.dumps(metadata))
    return ("\n".join(out) + "\n").encode()


def live_counts(report: dict, counters: dict) -> dict:
    """What a live run reported, and Dynamo's counters for it."""
    c = report["compile"]
    return {
        "compiles": c["compiles"],
        "recompiles": c["recompiles"],
        "graph_breaks": c["graph_breaks"],
        "unique_graphs": c["unique_graphs"],
        "categories": [e["category"] for e in c["recompile_events"]],
        "limit_hits": [h["limit"] for h in c["recompile_limit_hits"]],
        "dynamo": {group: counters.get(group, {}) for group in ("frames", "stats")},
    }


def child(names: list[str], out: Path) -> None:
    """Run the scenarios in this interpreter (``TORCH_TRACE`` is set), each into its own log."""
    import torch
    from torch._logging import _internal as logs, structured

    sys.path.insert(0, str(TESTS / "e2e"))
    import test_doctor_scenarios as suite

    trace_log = logs.trace_log
    for scenario in suite.SCENARIOS:
        if names and scenario.id not in names:
            continue
        scratch = Path(tempfile.mkdtemp(prefix="torch-trace-"))
        for handler in list(trace_log.handlers):
            if isinstance(handler, logs.LazyTraceHandler):
                handler.close()
                trace_log.removeHandler(handler)
        structured.INTERN_TABLE.clear()  # a file names each source file once: the new log must say it again
        handler = logs.LazyTraceHandler(str(scratch / "trace"))
        handler.setFormatter(logs.TorchLogsFormatter(trace=True))
        trace_log.addHandler(handler)
        outcome = suite.run_scenario(scenario, scratch / "run")
        handler.close()
        (log,) = (scratch / "trace").glob("*.log")
        target = out / torch.__version__.split("+")[0] / scenario.id
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        (target / "trace.log.gz").write_bytes(gzip.compress(trim(log), mtime=0))
        live = {
            "torch": torch.__version__,
            "scenario": scenario.id,
            "none_offset": NONE_OFFSET,
            **live_counts(outcome.report, outcome.counters),
        }
        (target / "live.json").write_text(json.dumps(live, indent=1, sort_keys=True) + "\n")
        shutil.rmtree(scratch)
        print(
            f"{target.relative_to(out)}: {live['compiles']} compiles, {live['recompiles']} recompiles "
            f"{live['categories']}, {live['graph_breaks']} graph breaks, limit {live['limit_hits']}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CORPUS, help="corpus root (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated scenario ids (default: all)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    if args.child:
        child(names, args.out)
        return
    with tempfile.TemporaryDirectory() as first:  # torch sets up its trace handler when TORCH_TRACE is set
        env = {
            **os.environ,
            "TORCH_TRACE": first,
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        command = [sys.executable, __file__, "--child", "--out", str(args.out), "--only", args.only]
        sys.exit(subprocess.run(command, env=env, cwd=TESTS).returncode)


if __name__ == "__main__":
    main()
