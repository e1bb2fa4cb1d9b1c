"""The terminal view of `torchrepro env` (:func:`torchrepro.capture.environment.collect`'s data): versions,
determinism switches, compile caches, risky variables. Values (paths, variables) pass through
:func:`~torchrepro.render.console.shown` and are shown as plain text (no rich markup from paths
or values); names, values and paths wrap, never cut. Nothing here imports torch."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..eventlog.events import NOT_AVAILABLE
from ..eventlog.payloads import EnvInfo
from .console import ABSENT, console as make_console, shown, text_columns


def render_env(info: EnvInfo, console: Console | None = None) -> None:
    """Print `collect()` output as rich tables; risky rows in red.

    Example: ``render_env(envinfo.collect())``, or ``render_env(info, Console(file=buf))`` to capture it.
    """
    console = console or make_console()
    info = shown(info)  # paths and variables come from outside
    title = f"torchrepro {info['torchrepro']} — env fingerprint {info['env_fingerprint']}"
    versions = Table(title=title, show_header=False, title_justify="left")
    versions.add_column(style="bold", no_wrap=True)
    versions.add_column(overflow="fold")
    for key, value in info["versions"].items():
        versions.add_row(key, Text(value), style="dim" if value == NOT_AVAILABLE else None)
    hardware = info["hardware"]
    versions.add_row("platform", Text(str(hardware["platform"])))
    versions.add_row("cpu_capability", Text(str(hardware["cpu_capability"])))
    versions.add_row("cpus", f"{hardware['cpus_usable']} usable of {hardware['cpu_count']}")
    versions.add_row("gpus", Text(", ".join(hardware["gpus"]) or "none"))
    threads = info["threads"]
    versions.add_row("threads", f"{threads['intra_op']} intra-op, {threads['inter_op']} inter-op")
    codec = info["step_codec"]
    versions.add_row("step codec", Text(codec), style=None if codec == "C" else "yellow")
    console.print(versions)

    marks = {"ok": ("✓", "green"), "risk": ("✗", "bold red"), "info": ("–", "dim")}
    audit_table = Table(title="Determinism switches", title_justify="left")
    audit_table.add_column("", no_wrap=True)
    text_columns(audit_table, "switch", "value", "recommended", "note")
    for s in info["determinism"]:
        mark, style = marks[s["status"]]
        recommended = ABSENT if s["recommended"] is None else s["recommended"]
        audit_table.add_row(
            Text(mark, style=style),
            *_cells(s["name"], s["value"], recommended, s["note"]),
            style="red" if s["status"] == "risk" else None,
        )
    console.print(audit_table)

    caches = Table(title="Compile caches", title_justify="left")
    text_columns(caches, "cache", "path", "from", "exists", "owner", "mode", "risk")
    for c in info["caches"]:
        risk = "\n".join(c["risks"]) or c["note"]
        caches.add_row(
            *_cells(
                c["name"],
                c["path"],
                c["source"],
                "yes" if c["exists"] else "no",
                c["owner"] or ABSENT,
                c["mode"] or ABSENT,
                risk,
            ),
            style="bold red" if c["risks"] else None,
        )
    console.print(caches)

    env = Table(title="Environment variables", title_justify="left")
    text_columns(env, "variable", "value", "note")
    for v in info["env_vars"]:
        env.add_row(*_cells(v["name"], v["value"], v["note"]), style="red" if v["risky"] else None)
    console.print(env)


def _cells(*values: Any) -> list[Any]:
    """Table cells as plain text (no rich markup from paths or values); None shows as 'unset'."""
    return [Text("unset" if v is None else str(v)) for v in values]
