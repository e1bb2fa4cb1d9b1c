"""`torchrepro watch RUN_DIR`: a live view of a run being written (here, or on a shared
filesystem by a cluster job), and the compact status line ``doctor`` shows while its script runs.

The view: steps/s per rank, the ranks that lag, compiles and recompiles so far by category, the
latest graph break with its line, findings as they appear. New rank directories are picked up as
they appear; the view ends when the run ends. ``--once --json`` prints one snapshot.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import options
from ..errors import InputError
from ..eventlog.tail import RunFollower

if TYPE_CHECKING:  # rich is imported where a view is drawn: every torchrepro process imports this module
    from rich.console import Group

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def add_parser(sub: Any) -> None:
    """Register ``torchrepro watch``."""
    p = sub.add_parser("watch", help="live view of a run being written: steps/s, lagging ranks, recompiles")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--json", action="store_true", help="with --once: the snapshot as JSON")
    p.add_argument(
        "--interval",
        type=options.positive_float,
        default=1.0,
        metavar="S",
        help="seconds between refreshes (default 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Follow RUN_DIR until its run ends (or print one snapshot with ``--once``)."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise InputError(f"no such run directory: {run_dir}")
    if args.json and not args.once:
        raise InputError("--json needs --once (a live view is for a terminal)")
    if args.interval <= 0:
        raise InputError("--interval must be > 0")
    from rich.console import Console
    from rich.live import Live

    follower = RunFollower(run_dir)
    follower.poll()
    if args.once:
        snap = follower.snapshot()
        if args.json:
            print(json.dumps(snap, indent=2))
        else:
            Console().print(render(snap))
        return 0
    console = Console()
    with Live(render(follower.snapshot()), console=console, refresh_per_second=4, transient=False) as live:
        while not follower.finished:
            time.sleep(args.interval)
            follower.poll()
            live.update(render(follower.snapshot()))
    return 0


def _clean(text: Any) -> str:
    """Text from the user's script (sources, reasons, paths), safe for a terminal."""
    return _CONTROL.sub("?", str(text))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _categories(snap: dict[str, Any]) -> str:
    by = snap["recompiles_by_category"]
    return ", ".join(f"{_clean(k)} {v}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))


def status_line(snap: dict[str, Any]) -> str:
    """One line: ranks, steps, steps/s, compiles, recompiles by category, graph breaks, lag."""
    ranks = snap["ranks"]
    steps = max((r["steps"] for r in ranks.values()), default=0)
    rates = [r["steps_per_s"] for r in ranks.values() if r["steps_per_s"] is not None]
    parts = [
        f"{snap['ranks_seen']}/{snap['world_size']} rank(s)",
        f"step {steps}",
        f"{_rate(min(rates) if rates else None)} steps/s",
        f"{snap['compiles']} compile(s)",
        f"{snap['recompiles']} recompile(s)" + (f" ({_categories(snap)})" if snap["recompiles"] else ""),
        f"{snap['graph_breaks']} graph break(s)",
    ]
    if snap["lagging_ranks"]:
        parts.append("lagging: rank " + ",".join(map(str, snap["lagging_ranks"])))
    return "torchrepro · " + " · ".join(parts)


def render(snap: dict[str, Any]) -> Group:
    """The whole live view of a snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    state = "finished" if snap["finished"] else "running"
    title = Text(
        f"torchrepro watch {_clean(snap['run_dir'])} — {state}, {snap['ranks_seen']}/{snap['world_size']} rank(s)",
        style="bold",
    )
    table = Table(show_edge=False, pad_edge=False)
    for column in ("rank", "status", "steps", "steps/s", "compiles", "recompiles", "graph breaks", "idle s"):
        table.add_column(column, justify="left" if column in ("rank", "status") else "right")
    lagging = set(snap["lagging_ranks"])
    for rank, r in snap["ranks"].items():
        age = r["last_event_age_s"]
        table.add_row(
            rank + (" (lags)" if int(rank) in lagging else ""),
            _clean(r["status"]),
            str(r["steps"]),
            _rate(r["steps_per_s"]),
            str(r["compiles"]),
            str(r["recompiles"]),
            str(r["graph_breaks"]),
            "-" if age is None or r["status"] != "running" else f"{age:.0f}",
            style="yellow" if int(rank) in lagging else None,
        )
    lines: list[Any] = [title, table if snap["ranks"] else Text("waiting for the first rank…", style="dim")]
    if snap["recompiles"]:
        lines.append(Text(f"recompiles by category: {_categories(snap)}"))
    gb = snap["latest_graph_break"]
    if gb:
        where = f"{_clean(gb['file'])}:{gb['line']}" if gb["file"] else "unknown location"
        lines.append(
            Text(f"latest graph break (rank {gb['rank']}, step {gb['step']}): {where}: {_clean(gb['reason'])}")
        )
        if gb["source"]:
            lines.append(Text(f"    {_clean(gb['source'])}", style="dim"))
    for f in snap["findings"][:8]:
        lines.append(Text(f" {f['severity'][0].upper()} ", style=_STYLE.get(f["severity"])) + Text(_clean(f["title"])))
    return Group(*lines)


class _Bytes(io.RawIOBase):
    """``sys.stdout.buffer`` while the status line shows: bytes go through the text proxy, so
    they print above the line instead of over it."""

    def __init__(self, text: Any):
        super().__init__()
        self._text = text

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._text.write(bytes(data).decode("utf-8", "replace"))
        return len(data)

    def flush(self) -> None:
        self._text.flush()


class _Text:
    def __init__(self, proxy: Any):
        self._proxy = proxy
        self.buffer = _Bytes(proxy)

    def write(self, text: str) -> int:
        return self._proxy.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proxy, name)


@contextmanager
def live_status(run_dir: Path, interval: float = 0.5) -> Iterator[None]:
    """While the body runs, show :func:`status_line` for ``run_dir`` as the terminal's bottom line
    (erased at the end). Only when stdout and stderr are both terminals; the script's output
    prints above the line, never into it."""
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        yield
        return
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    follower = RunFollower(run_dir)
    stop = threading.Event()
    console = Console(stderr=True)
    with Live(
        Text(""), console=console, transient=True, redirect_stdout=True, redirect_stderr=True, auto_refresh=False
    ) as live:
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Text(sys.stdout), _Text(sys.stderr)

        def refresh() -> None:
            shown = ""
            while not stop.wait(interval):
                try:
                    follower.poll()
                    line = status_line(follower.snapshot()) if follower.live.ranks else ""
                    if line != shown:
                        live.update(Text(line, style="dim", no_wrap=True, overflow="ellipsis"), refresh=True)
                        shown = line
                except Exception:  # noqa: BLE001 - a status line must never stop the run it shows
                    return

        thread = threading.Thread(target=refresh, name="torchrepro-status", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            sys.stdout, sys.stderr = saved
