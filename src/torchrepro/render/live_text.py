"""The live view of a run being written: what ``torchrepro watch`` draws, and the one-line status
``doctor`` shows at the bottom of the terminal while its script runs (:func:`live_status`).

:class:`FollowedRun` joins the two halves below it: :class:`~torchrepro.eventlog.tail.RunFollower`
reads what is new in the run directory, :class:`~torchrepro.analysis.live.LiveRun` takes the
events in, and :meth:`FollowedRun.snapshot` is the view's data (``watch --once --json`` prints it).
Every text of a snapshot passes through :func:`~torchrepro.render.console.shown` before it is
drawn: a file name or graph-break reason from the user's script cannot control the terminal, a
newline in it shows as ``\\n`` (the status line stays one line), and a path is shown by the one
rule (relative under the working directory).
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..analysis.live import LiveRun, is_finished, snapshot
from ..eventlog.tail import RunFollower
from ..reports.live_snapshot import LiveSnapshot, WatchSnapshot
from .console import ABSENT, figure_columns, location, shown, text_columns

if TYPE_CHECKING:  # rich is imported where a view is drawn: doctor imports this module in every run
    from rich.console import Group

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


class FollowedRun:
    """A run directory followed while it is written, its events fed to a :class:`LiveRun`.

    >>> run = FollowedRun(Path("torchrepro-runs/x"))  # doctest: +SKIP
    >>> run.poll(); run.snapshot()["ranks"]  # doctest: +SKIP
    """

    def __init__(self, run_dir: Path):
        self.follower = RunFollower(run_dir)
        self.live = LiveRun()

    def poll(self) -> int:
        """Take in what is new in the run directory; returns how many events were read."""
        events = self.follower.poll()
        for rank, event in events:
            self.live.add(rank, event)
        return len(events)

    def snapshot(self, now: float | None = None) -> WatchSnapshot:
        """The run as read so far (see :func:`torchrepro.analysis.live.snapshot`)."""
        when = time.time() if now is None else now
        return {
            "run_dir": str(self.follower.run_dir),
            **snapshot(self.live, self.follower.meta, when, unreadable=self.follower.unreadable),
        }

    @property
    def finished(self) -> bool:
        return is_finished(self.live, self.follower.meta)


def _rate(value: float | None) -> str:
    return ABSENT if value is None else f"{value:.1f}"


def _categories(snap: LiveSnapshot) -> str:
    by = snap["recompiles_by_category"]
    return ", ".join(f"{k or 'other'} {v}" for k, v in sorted(by.items(), key=lambda kv: -kv[1]))


def status_line(snap: LiveSnapshot) -> str:
    """One line: ranks, steps, steps/s, compiles, recompiles by category, graph breaks, lag."""
    snap = shown(snap)
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


def render(snap: WatchSnapshot) -> Group:
    """The whole live view of a snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    snap = shown(snap)
    state = "finished" if snap["finished"] else "running"
    title = Text(
        f"torchrepro watch {snap['run_dir']} — {state}, {snap['ranks_seen']}/{snap['world_size']} rank(s)",
        style="bold",
    )
    table = Table(show_edge=False, pad_edge=False)
    text_columns(table, "rank", "status")
    figure_columns(table, "steps", "steps/s", "compiles", "recompiles", "graph breaks", "idle s")
    lagging = set(snap["lagging_ranks"])
    for rank, r in snap["ranks"].items():
        age = r["last_event_age_s"]
        table.add_row(
            Text(rank + (" (lags)" if int(rank) in lagging else "")),
            Text(r["status"]),
            str(r["steps"]),
            _rate(r["steps_per_s"]),
            str(r["compiles"]),
            str(r["recompiles"]),
            str(r["graph_breaks"]),
            ABSENT if age is None or r["status"] != "running" else f"{age:.0f}",
            style="yellow" if int(rank) in lagging else None,
        )
    lines: list[Any] = [title, table if snap["ranks"] else Text("waiting for the first rank…", style="dim")]
    if snap["recompiles"]:
        lines.append(Text(f"recompiles by category: {_categories(snap)}"))
    gb = snap["latest_graph_break"]
    if gb:
        where = location(gb["file"], gb["line"]) if gb["file"] else "unknown location"
        step = ABSENT if gb["step"] is None else gb["step"]
        lines.append(Text(f"latest graph break (rank {gb['rank']}, step {step}): {where}: {gb['reason']}"))
        if gb["source"]:
            lines.append(Text(f"    {gb['source']}", style="dim"))
    for f in snap["findings"][:8]:
        lines.append(Text(f" {f['severity'][0].upper()} ", style=_STYLE.get(f["severity"], "")) + Text(f["title"]))
    if len(snap["findings"]) > 8:
        lines.append(Text(f" … {len(snap['findings']) - 8} more (watch --once --json lists them)", style="dim"))
    return Group(*lines)


class _Bytes(io.RawIOBase):
    """``sys.stdout.buffer`` while the status line shows: bytes go through the text proxy, so
    they print above the line instead of over it."""

    def __init__(self, text: TextIO):
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
    def __init__(self, proxy: TextIO):
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

    run = FollowedRun(run_dir)
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
                    run.poll()
                    line = status_line(run.snapshot()) if run.live.ranks else ""
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
