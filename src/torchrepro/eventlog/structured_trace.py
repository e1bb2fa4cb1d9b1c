"""PyTorch's structured trace (``TORCH_TRACE``) → torchrepro events.

The same :class:`TraceTranslator` serves two inputs: records seen live by a handler on the
``torch.__trace`` logger (``capture.compile_events``), and ``TORCH_TRACE`` log files written by a job
that ran without torchrepro (:func:`read_trace_dir`). A record is a metadata dict plus an
optional payload string. Record types this module does not use are counted, never fatal, so
newer torch versions that add records keep working. Events keep what torch said (a recompile's
reasons, not their category: :mod:`torchrepro.analysis.categories` reads them). Nothing here
imports torch or analysis.

What differs between the torch versions read (2.6 to 2.14): torch 2.6 writes a recompile-limit hit
as a ``bwd_compilation_metrics`` record (``fail_reason`` "cache_size_limit reached"; later versions
a ``compilation_metrics`` one, "recompile limit exceeded ... Limit type: recompile_limit"), has no
``recompile_reason`` in its metrics (the ``recompile_reasons`` artifact says it), and guards a bool
or None by identity (``___check_obj_id(L['flag'], <id>)``, later ``L['flag'] == True``): which ids
are Python constants is told by comparing them with this process's own constants (live capture:
``constants``), or in a log read afterwards by the guards of the compile that replaced them: the
same source guarded by value, or by an id as far from the failed one as two constants are
(:meth:`TraceTranslator._constant_ids`; None replaced by a bool is recognised in a log written by
the reading Python's build only).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TypedDict

from .event_reader import OVERSIZED, LineReader, open_regular
from .events import CacheLookup, Compile, Event, GraphBreak
from .payloads import JsonObject

TraceRecord = JsonObject  # a record's metadata as torch wrote it: its keys vary with the torch version

_CONTEXT_KEYS = {
    "frame_id",
    "frame_compile_id",
    "attempt",
    "rank",
    "has_payload",
    "stack",
    "compiled_autograd_id",
    "subgraph_name",
}
_USED = {"str", "dynamo_start", "dynamo_cpp_guards_str", "compilation_metrics", "bwd_compilation_metrics", "artifact"}
_CACHE_ARTIFACT = re.compile(r"^(fx_graph|aotautograd)_cache_(hit|miss|bypass)$")
_GB_ID = re.compile(r"/gb/(gb\d+)\.html", re.IGNORECASE)
_GB_LOCATION = re.compile(r"Graph break in user code at (.+):(\d+)")
_WRAPPED = "Graph break encountered:"  # ends Dynamo's sentence about a break it cannot resume from
_TORCH_FILE = re.compile(r"[/\\](site|dist)-packages[/\\]torch[/\\]|^<")
_LIMIT = re.compile(r"recompile limit exceeded|\b(\w*(?:recompile|cache_size)_limit) reached", re.IGNORECASE)
_LIMIT_TYPE = re.compile(r"Limit type: (\w+)")
_ID_GUARD = re.compile(r"___check_obj_id\((.+?), (\d+)\)")
_VALUE_GUARD = re.compile(r"^[| +-]*EQUALS_MATCH: (.+?) == ", re.MULTILINE)
# The constants torch 2.6 guards by identity (True, False, None) are static objects of the interpreter, at
# fixed distances from one another in one CPython build (the two bools 32 bytes apart in every 64-bit build,
# None elsewhere in each): the distance between a failed identity guard's id and its replacement's names the
# two constants in a log written by this build (a log read where it was written); another build's None differs
_CONSTANT_OFFSETS = {id(a) - id(b): repr(a) for a in (True, False, None) for b in (True, False, None) if a is not b}


def constant_ids() -> dict[int, str]:
    """This process's Python constants that Dynamo may guard by identity, by id: True, False, None,
    Ellipsis and the small ints CPython keeps one object of (-5 to 256)."""
    return {id(value): repr(value) for value in (True, False, None, Ellipsis, *range(-5, 257))}


def record_kind(metadata: TraceRecord) -> str:
    """The record's type: the one key that is not context (``dynamo_start``, ``artifact``...)."""
    return next((k for k in metadata if k not in _CONTEXT_KEYS), "")


def _compile_id(metadata: TraceRecord) -> str:
    frame, attempt = metadata.get("frame_id"), metadata.get("frame_compile_id")
    cid = f"{frame}/{attempt}" if frame is not None else "?"
    if metadata.get("compiled_autograd_id") is not None:
        cid = f"!{metadata['compiled_autograd_id']}/{cid}"
    return cid


def _seconds(value: Any, scale: float = 1.0) -> float | None:
    return None if value is None else round(float(value) * scale, 6)


def _first_line(text: str | None) -> str | None:
    return text.strip().splitlines()[0] if text and text.strip() else None


class GraphBreakText(TypedDict):
    """What a graph-break payload says: the fields of :class:`~.events.GraphBreak` it gives."""

    reason: str
    explanation: str
    hints: list[str]
    gb_id: str | None
    file: str | None
    line: int | None
    source: str | None


def parse_graph_break(text: str) -> GraphBreakText:
    """Reason (Dynamo's graph-break type), explanation, hints, ``GBxxxx`` id and user location
    from a ``dynamo_graph_break_reason`` payload."""
    location = _GB_LOCATION.search(text)
    body = text.split("Graph Break Reason:", 1)[-1].split("User code traceback:", 1)[0]
    lines = [ln.strip() for ln in body.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("Encountered graph break when attempting")]
    # a break Dynamo cannot resume from is said as what Dynamo does about it, then the break itself
    # ("Encountered graph break that we cannot resume from. ... Graph break encountered:", or "Failed to
    # handle graph break gracefully. ..."), the break's own type on the next line: the reason is that type,
    # then what Dynamo did
    wrapped = lines[0].removesuffix(_WRAPPED).strip() if len(lines) > 1 and lines[0].endswith(_WRAPPED) else None
    if wrapped is not None:
        lines = lines[1:]
    reason = lines[0] if lines else "unknown graph break"
    if wrapped:
        reason = f"{reason} ({wrapped})"
    explanation = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Explanation:")), "")
    hints = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Hint:")]
    hints = [h for h in hints if "report an issue to PyTorch" not in h]
    gb = _GB_ID.search(text)
    source = None
    if location:
        # The user line is printed under its "File ..., line N" entry in the traceback.
        tb = text.split("User code traceback:", 1)[-1]
        m = re.search(rf'File "{re.escape(location.group(1))}", line {location.group(2)}, in .+\n\s+(.+)', tb)
        source = m.group(1).strip() if m else None
    return {
        "reason": reason,
        "explanation": explanation,
        "hints": hints[:3],
        "gb_id": gb.group(1).upper() if gb else None,
        "file": location.group(1) if location else None,
        "line": int(location.group(2)) if location else None,
        "source": source,
    }


def _parse_reasons(payload: str | None) -> list[str]:
    if not payload:
        return []
    try:
        value = json.loads(payload)
    except ValueError:
        return [payload.strip()]
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _strip_compile_prefix(reason: str) -> str:
    """``"0/1: tensor 'x' ..."`` → ``"tensor 'x' ..."`` (Dynamo prefixes the failing entry's id)."""
    return re.sub(r"^\d+/\d+: ", "", reason, count=1)


@dataclass
class _Pending:
    function: str | None = None
    file: str | None = None
    line: int | None = None
    call_site: str | None = None
    reasons: list[str] = field(default_factory=list)
    id_guards: dict[str, int] = field(default_factory=dict)  # source -> the id its identity guard names
    value_guards: set[str] = field(default_factory=set)  # sources guarded by equality (EQUALS_MATCH)


@dataclass
class TraceTranslator:
    """Turns structured-trace records into events, keeping the little state that needs:
    interned file names, and what was said about a compile before its metrics arrived.
    ``constants``: :func:`constant_ids` where the records come from this process (live capture)."""

    rank: int = 0
    constants: dict[int, str] = field(default_factory=dict)
    strings: dict[int, str] = field(default_factory=dict)
    pending: dict[str, _Pending] = field(default_factory=dict)
    compiles: dict[str, Compile] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)
    locations: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    unique_graphs: int = 0

    def feed(self, metadata: TraceRecord, payload: str | None = None) -> list[Event]:
        """Translate one record; returns the events it completes (often none)."""
        kind = record_kind(metadata)
        self.counts[kind if kind in _USED or kind == "dynamo_output_graph" else "other"] += 1
        handler = getattr(self, f"_on_{kind}", None)
        return handler(metadata, payload) or [] if handler else []

    def _on_str(self, metadata: TraceRecord, payload: str | None) -> None:
        text, index = metadata["str"]
        self.strings[int(index)] = text

    def _on_dynamo_output_graph(self, metadata: TraceRecord, payload: str | None) -> None:
        self.unique_graphs += 1

    def _on_dynamo_cpp_guards_str(self, metadata: TraceRecord, payload: str | None) -> None:
        """The guards a compile installed (torch 2.6 to 2.14 write them as this record): which sources
        it guards by identity and which by value, to tell what an identity guard that fails later named."""
        if payload and ("___check_obj_id(" in payload or "EQUALS_MATCH: " in payload):
            item = self.pending.setdefault(_compile_id(metadata), _Pending())
            item.id_guards.update((source, int(n)) for source, n in _ID_GUARD.findall(payload))
            item.value_guards.update(_VALUE_GUARD.findall(payload))

    def _constant_ids(self, reasons: list[str], replaced_by: _Pending) -> dict[str, str]:
        """The ids in ``reasons`` that name a Python constant: this process's own (live), else as the
        guards of the compile that replaced the failed entry show it (``replaced_by``): the same source
        now guarded by value, or by the identity of another constant (:data:`_CONSTANT_OFFSETS`)."""
        out = {}
        for source, n in _ID_GUARD.findall(" ".join(reasons)):
            now = replaced_by.id_guards.get(source)
            if int(n) in self.constants:
                out[n] = self.constants[int(n)]
            elif source in replaced_by.value_guards:
                out[n] = "value"
            elif now is not None and int(n) - now in _CONSTANT_OFFSETS:
                out[n] = _CONSTANT_OFFSETS[int(n) - now]
        return out

    def _file(self, value: Any) -> str | None:
        return self.strings.get(value, f"<file #{value}>") if isinstance(value, int) else value

    def _on_dynamo_start(self, metadata: TraceRecord, payload: str | None) -> None:
        stack = metadata["dynamo_start"].get("stack") or []
        item = self.pending.setdefault(_compile_id(metadata), _Pending())
        if stack:
            top = stack[-1]
            item.function, item.file, item.line = top.get("name"), self._file(top.get("filename")), top.get("line")
        callers = [(self._file(f.get("filename")), f.get("line")) for f in stack[:-1]]
        user = [c for c in callers if not _TORCH_FILE.search(c[0] or "")]
        if user or callers:
            file, line = (user or callers)[-1]
            item.call_site = f"{file}:{line}"

    def _on_artifact(self, metadata: TraceRecord, payload: str | None) -> list[Event] | None:
        name = metadata["artifact"].get("name", "")
        cid = _compile_id(metadata)
        if name == "recompile_reasons":
            self.pending.setdefault(cid, _Pending()).reasons = _parse_reasons(payload)
        elif name == "dynamo_graph_break_reason" and payload:
            return [GraphBreak(rank=self.rank, compile_id=cid, **parse_graph_break(payload))]
        elif m := _CACHE_ARTIFACT.match(name):
            return [self._cache_lookup(cid, m.group(1), m.group(2), payload)]
        return None

    def _cache_lookup(self, cid: str, cache: str, status: str, payload: str | None) -> CacheLookup:
        try:
            info = json.loads(payload or "{}")
        except ValueError:
            info = {}
        components = []
        for comp in info.get("components") or []:
            m = re.match(r"\[(\w+)\]\s*(.*)", str(comp), re.DOTALL)
            digest, what = (m.group(1), m.group(2)) if m else ("", str(comp))
            components.append({"hash": digest, "what": " ".join(what.split())[:300]})
        return CacheLookup(
            rank=self.rank,
            compile_id=cid,
            cache="fxgraph" if cache == "fx_graph" else cache,
            status=status,
            key=info.get("key"),
            reason=info.get("reason"),
            components=components,
        )

    def _on_compilation_metrics(self, metadata: TraceRecord, payload: str | None) -> list[Event] | None:
        return self._compiled(metadata, metadata["compilation_metrics"])

    def _compiled(self, metadata: TraceRecord, m: TraceRecord) -> list[Event]:
        """The compile event of a metrics record ``m`` (with what was said before it)."""
        cid = m.get("compile_id") or _compile_id(metadata)
        item = self.pending.pop(cid, _Pending())
        frame = cid.split("/", 1)[0]
        function = m.get("co_name") or item.function or self.functions.get(frame)
        if function:
            self.functions.setdefault(frame, function)
        # A compile that fails before tracing (recompile-limit hit) has no dynamo_start and null
        # co_* fields: its frame's earlier compiles say which function it is.
        file, line = m.get("co_filename") or item.file, m.get("co_firstlineno") or item.line
        if file:
            self.locations.setdefault(frame, (file, line))
        else:
            file, line = self.locations.get(frame, (None, None))
        reasons = [_strip_compile_prefix(r) for r in item.reasons]
        if not reasons and m.get("recompile_reason"):
            reasons = [_strip_compile_prefix(m["recompile_reason"])]
        fail_reason = m.get("fail_reason")
        limit = None
        if fail_reason and (hit := _LIMIT.search(fail_reason)):
            found = _LIMIT_TYPE.search(fail_reason)
            limit = found.group(1) if found else hit.group(1) or "recompile_limit"
        event = Compile(
            rank=self.rank,
            compile_id=cid,
            function=function,
            file=file,
            line=line,
            call_site=item.call_site,
            dynamo_s=_seconds(m.get("entire_frame_compile_time_s")),
            backend_s=_seconds(m.get("backend_compile_time_s")),
            inductor_s=_seconds(m.get("inductor_compile_time_s")),
            build_s=_seconds(m.get("triton_compile_time_us"), 1e-6),
            guards=m.get("guard_count"),
            graph_ops=m.get("graph_op_count"),
            cache=_cache_counts(m),
            recompile_reasons=reasons,
            constant_ids=self._constant_ids(reasons[:1], item),
            fail_type=m.get("fail_type"),
            fail_reason=_first_line(fail_reason),
            limit_hit=limit,
            logging_overhead_s=_seconds(m.get("structured_logging_overhead_s")),
        )
        self.compiles[cid] = event
        return [event]

    def _on_bwd_compilation_metrics(self, metadata: TraceRecord, payload: str | None) -> list[Event] | None:
        m = metadata["bwd_compilation_metrics"]
        event = self.compiles.get(m.get("compile_id") or _compile_id(metadata))
        if event is None:  # torch 2.6 writes a compile that failed before tracing (the recompile limit) so
            return self._compiled(metadata, m) if m.get("fail_type") else None
        event.backward_s = _seconds(m.get("inductor_compile_time_s"))
        for name, counts in _cache_counts(m).items():
            merged = event.cache.setdefault(name, {})
            for status, n in counts.items():
                merged[status] = merged.get(status, 0) + n
        return None


def _cache_counts(m: TraceRecord) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, prefix in (("fxgraph", "inductor_fx"), ("aotautograd", "aotautograd")):
        for status in ("hit", "miss"):
            n = sum(m.get(f"{prefix}_{where}_cache_{status}_count") or 0 for where in ("local", "remote"))
            if n:
                out.setdefault(name, {})[status] = n
    return out


# --- TORCH_TRACE files ---------------------------------------------------------------------

_LINE = re.compile(r"^[A-Z]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})\s*$")


def iter_trace_file(path: Path, counts: Counter[str] | None = None) -> Iterator[tuple[TraceRecord, str | None]]:
    """(metadata, payload) records of one ``TORCH_TRACE`` log. Damaged records are skipped and
    counted in ``counts["malformed"]``: a line that is neither a record nor a payload line, metadata
    that is not JSON, a payload whose MD5 is not the one its metadata names (``has_payload``: a
    record cut, the file ending mid-record). A line over :data:`~.event_reader.MAX_LINE` bytes is damage
    too, never held whole; only a regular file is read (:func:`~.event_reader.open_regular`)."""
    counts = Counter() if counts is None else counts
    metadata: TraceRecord | None = None
    payload: list[bytes] = []
    with open_regular(path) as fp:
        for raw in LineReader(fp):
            if raw.startswith(b"\t"):
                payload.append(raw[1:])
                continue
            if metadata is not None:
                yield from _checked(metadata, payload, counts)
            metadata, payload = None, []
            m = _LINE.match(raw.decode("utf-8", errors="replace")) if raw is not OVERSIZED else None
            try:
                metadata = json.loads(m.group(1)) if m else None
            except ValueError:
                metadata = None
            if metadata is None and raw.strip() or metadata is not None and not isinstance(metadata, dict):
                metadata = None
                counts["malformed"] += 1
    if metadata is not None:
        yield from _checked(metadata, payload, counts)


def _checked(
    metadata: TraceRecord, payload: list[bytes], counts: Counter[str]
) -> Iterator[tuple[TraceRecord, str | None]]:
    """The record, unless its payload is not the one its metadata's MD5 names (then counted)."""
    text = b"\n".join(payload)
    expected = metadata.get("has_payload")
    if isinstance(expected, str) and hashlib.md5(text, usedforsecurity=False).hexdigest() != expected:
        counts["malformed"] += 1
        return
    yield metadata, text.decode("utf-8", errors="replace") + "\n" if payload else None


def trace_files(trace_dir: Path) -> list[Path]:
    """The log files of a ``TORCH_TRACE`` directory."""
    return sorted(p for p in Path(trace_dir).glob("*.log") if p.is_file())


def _rank_of_file(path: Path) -> int | None:
    m = re.search(r"rank_(\d+)", path.name)
    return int(m.group(1)) if m else None


def translate_file(path: Path, rank: int = 0) -> tuple[list[Event], TraceTranslator]:
    """Every event of one ``TORCH_TRACE`` log file, and the translator (for its counts)."""
    named = _rank_of_file(path)
    rank = named if named is not None else rank
    translator = TraceTranslator(rank=rank)
    events: list[Event] = []
    for metadata, payload in iter_trace_file(path, translator.counts):
        if "rank" in metadata and isinstance(metadata["rank"], int):
            translator.rank = metadata["rank"]
        try:
            events.extend(translator.feed(metadata, payload))
        except (KeyError, TypeError, ValueError, AttributeError):
            translator.counts["malformed"] += 1
    return events, translator
