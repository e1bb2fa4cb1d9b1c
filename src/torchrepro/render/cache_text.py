"""The terminal views of `torchrepro cache status` and `cache explain-miss`. File names, writers and
key components come from the cache directory and the user's code: every string passes through
:func:`~torchrepro.render.console.shown` and is printed as plain text."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analysis.cache_misses import MissExplanation
from ..reports.cache_status import CacheStatus
from ..reports.findings import Finding
from .console import ABSENT, console as make_console, figure_columns, shown, text_columns
from .terminal import render_findings


def size_text(n: int) -> str:
    """A byte count as ``1.2 MB`` (from 100 kB up) or ``3.4 kB``.

    >>> size_text(2_500_000), size_text(1_500)
    ('2.5 MB', '1.5 kB')
    """
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def render_status(report: CacheStatus, console: Console | None = None) -> None:
    """The inventory of a compile cache (:func:`torchrepro.cache.inventory.status`): totals, one row
    per kind of file, who wrote it, what is never hit, and the findings."""
    console = console or make_console()
    report = shown(report)  # file names and writers come from the cache directory
    perms, totals = report["permissions"], report["totals"]
    console.print(
        Text(
            f"inductor cache {report['path']} ({report['source']}): {totals['files']} files, "
            f"{size_text(totals['bytes'])}; owner {perms['owner']}, mode {perms['mode']}"
        ),
        highlight=False,
    )
    table = Table(show_edge=False, pad_edge=False)
    text_columns(table, "kind")
    figure_columns(table, "files", "keys", "size", "oldest", "newest", "never hit")
    for name, row in report["categories"].items():
        table.add_row(
            name,
            str(row["files"]),
            str(row.get("keys", ABSENT)),
            size_text(row["bytes"]),
            _age(row["oldest_age_s"]),
            _age(row["newest_age_s"]),
            str(row["unreachable"] or ""),
        )
    console.print(table)
    build = report["this_build"]
    for what, counts in report["written_by"].items():
        values = ", ".join(f"{value} ({n})" for value, n in counts.items())
        console.print(
            Text(f"written by {what}: {values}   (this process: {build.get(what) or ABSENT})", style="dim"),
            highlight=False,
        )
    for group in report["unreachable"]:
        console.print(
            Text(f"never hit: {group['files']} {group['category']} file(s): {group['why']}", style="yellow"),
            highlight=False,
        )
    render_findings(console, [Finding(**f) for f in report["findings"]])
    if not report["findings"]:
        console.print(Text("no findings: only you can write to this cache", style="green"))


def render_explain(result: MissExplanation, console: Console | None = None) -> None:
    """Why run B could not reuse run A's compile-cache entries (:func:`torchrepro.analysis.cache_misses.explain_misses`):
    the key component behind each miss, with its fix."""
    console = console or make_console()
    result = shown(result)  # key components quote the user's code
    for side in ("a", "b"):
        counts = ", ".join(f"{n} {status}" for status, n in sorted(result["lookups"][side].items()))
        console.print(Text(f"{side.upper()} = {result[side]}: {counts}"), highlight=False)
    if not result["causes"] and not result["same_key_misses"] and not result["bypassed"]:
        console.print(
            Text("same keys: B could reuse every entry A compiled", style="green")
            if not result["keys_differ"]
            else Text(f"{result['keys_differ']} key(s) differ, but neither run recorded key components", style="yellow")
        )
    for cause in result["causes"]:
        refs = sorted(
            {f"{result['pairs'][i]['b']['cache']} {result['pairs'][i]['b']['compile_id']}" for i in cause["lookups"]}
        )
        console.print(
            Text(f" ✗ {cause['detail']}", style="bold red")
            + Text(f"   ({len(cause['lookups'])} lookup(s): {', '.join(refs)})", style="dim"),
            highlight=False,
        )
        console.print(Text(f"   component: {cause['component']}\n   fix: {cause['fix']}", style="dim"), highlight=False)
    notes = {row["note"] for row in result["pairs"] if row["note"]}
    for note in notes:
        console.print(Text(f" · {note}", style="dim"), highlight=False)
    if result["same_key_misses"]:
        console.print(
            Text(
                f" · B missed {result['same_key_misses']} lookup(s) with A's exact key: the entries were "
                "not in B's cache directory (another TORCHINDUCTOR_CACHE_DIR, a cleared cache)",
                style="yellow",
            ),
            highlight=False,
        )
    for side, only in (("A", result["only_a"]), ("B", result["only_b"])):
        if only:
            ids = ", ".join(sorted({x["compile_id"] for x in only}))
            console.print(
                Text(
                    f" · compiles only in {side}: {ids} (a recompile or graph one run did not make)",
                    style="dim",
                ),
                highlight=False,
            )
