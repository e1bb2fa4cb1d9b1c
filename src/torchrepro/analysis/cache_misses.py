"""Why a compile-cache lookup missed: the key components that differ between two runs or ranks.

Inductor's FX-graph cache key is a hash over components (the graph, each input's metadata,
every inductor setting, the thread count, the torch build, ...); the structured trace records
each component as ``[hash] name: value``, and torchrepro stores them on ``CacheLookup`` events.
Two lookups of the same graph with different keys differ in at least one component's hash:
that component is the reason the second run could not reuse the first run's entry. On torch
2.13 AOTAutograd lookups carry no components (torch computes them only with its
``torch._functorch._aot_autograd.autograd_cache`` logger at DEBUG); their key covers the same
inductor details, so the FX-graph differences of the same compile explain them.
Nothing here imports torch.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping, Sequence, TypedDict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import PROBE_MISS, CacheLookup, End, Event, Step
from ..reports.findings import Finding

_NAME = re.compile(r"^([\w.]+(?:\[[^\]]*\])?):\s?(.*)$", re.DOTALL)
_FIELD = re.compile(r"(\w+)=")
_DEVICE = re.compile(r"device\(type='(\w+)'(?:, index=(\d+))?\)")


class KeyDifference(TypedDict):
    """One key component whose hash differs between two lookups, what it means and its fix."""

    component: str
    category: str
    label: str
    detail: str
    a: str
    b: str
    fix: str


class MissCause(KeyDifference):
    """A distinct cause of misses, with the indices (into ``pairs``) of the lookups it explains."""

    lookups: list[int]


class LookupRef(TypedDict):
    """Which lookup: where it ran, which compile and cache, how it ended."""

    rank: int
    compile_id: str
    cache: str
    status: str
    key: str | None
    step: int | None


class LookupPair(TypedDict):
    """Two matched lookups, the components that differ, or why one bypassed the cache (``note``)."""

    a: LookupRef
    b: LookupRef
    same_key: bool
    bypass: bool
    differences: list[KeyDifference]
    note: str | None


class _MissExplanation(TypedDict):
    pairs: list[LookupPair]
    causes: list[MissCause]
    same_key_misses: int
    beside_misses: int  # b looked the key up while a was still compiling it (the runs ran side by side)
    probe_misses: int  # b's entry was there; torchrepro's graph probe made the lookup a miss
    keys_differ: int
    bypassed: int
    only_a: list[LookupRef]
    only_b: list[LookupRef]
    lookups: dict[str, dict[str, int]]  # "a"/"b" -> status -> count


class MissExplanation(_MissExplanation, total=False):
    """What :func:`explain_misses` finds; ``a`` and ``b``: labels of the two sides, which the command adds."""

    a: str
    b: str


@dataclass(frozen=True)
class Cause:
    """What a key component means, in words, and how to make two runs agree on it."""

    category: str
    label: str
    fix: str


_GLOBAL_STATE = "Set it once, the same way in every run and rank, before the first compiled call."
_CAUSES: list[tuple[re.Pattern[str], Cause]] = [
    (re.compile(p), c)
    for p, c in [
        (
            r"^cpp_runtime_thread_count$",
            Cause(
                "threads",
                "CPU thread count (OMP_NUM_THREADS / torch.set_num_threads)",
                "Launch every run and rank with the same OMP_NUM_THREADS (torchrun sets 1 unless you set it), or call "
                "torch.set_num_threads(N) before the first compile; or set torch._inductor.config.cpp.threads to a fixed "
                "value so the key stops depending on it.",
            ),
        ),
        (
            r"^torch_version$",
            Cause(
                "torch",
                "torch build (version or installed source files)",
                "Use the same torch installation everywhere; a cache written by another build can never hit.",
            ),
        ),
        (
            r"^system_info",
            Cause(
                "system",
                "GPU model, CUDA/ROCm or Triton version",
                "Run on the same GPU model with the same CUDA and Triton; keep caches per hardware type.",
            ),
        ),
        (
            r"^gm$",
            Cause(
                "graph",
                "graph code (what Dynamo traced)",
                "The compiled graph itself differs: different model code, a graph break in another place, or "
                "different Dynamo settings. Compare the two runs' graphs (TORCH_LOGS=graph_code).",
            ),
        ),
        (
            r"^example_inputs",
            Cause(
                "inputs",
                "input metadata (shape, dtype, strides, device)",
                "Feed the same shapes, dtypes and layouts (drop_last=True, padding, .contiguous()), or mark the varying "
                "dimension dynamic.",
            ),
        ),
        (
            r"^fx_kwargs\[(is_inference|is_backward)\]$|^grad_enabled$",
            Cause(
                "grad_mode",
                "training vs inference (grad mode, eval/no_grad)",
                "Compile under the same grad mode: a torch.no_grad()/inference_mode call compiles a separate graph.",
            ),
        ),
        (
            r"^fx_kwargs\[static_input_idxs\]$",
            Cause(
                "static_inputs",
                "which inputs are static (parameters and buffers)",
                "Parameters were inputs in one run and attributes in the other (e.g. torch._dynamo.config."
                "inline_inbuilt_nn_modules, or a module passed as an argument): keep how the model is called the same.",
            ),
        ),
        (
            r"^fx_kwargs\[cudagraphs\]$",
            Cause(
                "cudagraphs", "CUDA graphs (mode='reduce-overhead')", "Use the same torch.compile mode in every run."
            ),
        ),
        (r"^fx_kwargs", Cause("compile_options", "torch.compile options", "Pass the same torch.compile options.")),
        (
            r"^deterministic_algorithms",
            Cause("determinism", "torch.use_deterministic_algorithms setting", _GLOBAL_STATE),
        ),
        (r"^default_dtype$", Cause("dtype", "default dtype (torch.set_default_dtype)", _GLOBAL_STATE)),
        (
            r"^cuda_matmul_settings$",
            Cause("matmul_precision", "matmul precision (TF32 / reduced-precision reductions)", _GLOBAL_STATE),
        ),
        (r"^autocast_state$", Cause("autocast", "autocast state", "Enter torch.autocast the same way in every run.")),
        (
            r"^default_cuda_device_index$",
            Cause(
                "device_index",
                "current device index",
                "Give every rank the same device index: CUDA_VISIBLE_DEVICES=<local rank> makes each rank's GPU cuda:0.",
            ),
        ),
        (
            r"^inductor_config(_comms)?\[",
            Cause(
                "inductor_config",
                "inductor setting",
                "Set torch._inductor.config (or TORCHINDUCTOR_* variables, or torch.compile(options=...)) identically "
                "before the first compile.",
            ),
        ),
        (
            r"^autograd_config\[|^aot_config$|^precompile_enabled$",
            Cause("functorch_config", "AOTAutograd/functorch setting", "Set torch._functorch.config identically."),
        ),
        (
            r"custom.*pass|_custom_partitioner_fn|_fuse_ddp_communication_passes",
            Cause(
                "custom_passes",
                "custom compiler passes",
                "Register the same custom passes (with a stable uuid()) in every run.",
            ),
        ),
        (
            r"triton_source|triton_kernel_source_codes",
            Cause("user_kernels", "user-defined Triton kernel source", "Use the same kernel source in every run."),
        ),
        (
            r"^cache_key_tag$",
            Cause("cache_key_tag", "torch.compiler.config.cache_key_tag", "Use the same cache_key_tag in every run."),
        ),
        (
            r"^provenance_tracking_level$",
            Cause(
                "tracing",
                "inductor provenance tracking (debug tracing)",
                "Turn compile tracing on or off in every run.",
            ),
        ),
    ]
]
_UNKNOWN = Cause("other", "cache key component", "Make this setting the same in both runs.")
_NO_COMPONENTS = (
    "torch did not record this lookup's key components (AOTAutograd records them only with its logger at DEBUG)"
)


def cause_of(name: str) -> Cause:
    """What a key component named ``name`` (e.g. ``inductor_config[max_autotune]``) is about.

    >>> cause_of("cpp_runtime_thread_count").category
    'threads'
    """
    return next((c for pattern, c in _CAUSES if pattern.search(name)), _UNKNOWN)


def _components(lookup: CacheLookup) -> dict[str, tuple[str, str]]:
    """name -> (hash, value) of a lookup's key components."""
    out = {}
    for comp in lookup.components:
        m = _NAME.match(comp.get("what", ""))
        name, value = (m.group(1), m.group(2)) if m else (comp.get("what", ""), "")
        out[name] = (comp.get("hash", ""), value.strip())
    return out


def _split_fields(text: str) -> dict[str, str]:
    """``TensorMetadata(dtype=..., shape=torch.Size([4, 8]), ...)`` -> {"dtype": ..., "shape": ...}
    (a value cut off by the trace's length limit is kept as far as it goes)."""
    fields: dict[str, str] = {}
    depth = 0
    current: list[str] = []
    for ch in text[text.find("(") + 1 :] + ")":
        if depth == 0 and ch in ",)":
            part = "".join(current).strip()
            if m := _FIELD.match(part):
                fields[m.group(1)] = part[m.end() :]
            current = []
            if ch == ")":
                break
            continue
        depth += (ch in "([{") - (ch in ")]}")
        current.append(ch)
    return fields


def _device(value: str) -> str:
    m = _DEVICE.search(value)
    return f"{m.group(1)}:{m.group(2)}" if m and m.group(2) is not None else m.group(1) if m else value


def _input_difference(name: str, a: str, b: str) -> tuple[Cause, str]:
    """The most specific way two inputs' metadata differ."""
    fa, fb = _split_fields(a), _split_fields(b)
    changed = [k for k in fa.keys() & fb.keys() if fa[k] != fb[k]]
    index = name[name.find("[") + 1 : -1] if "[" in name else "?"
    if "device" in changed:
        da, db = _device(fa["device"]), _device(fb["device"])
        if da.split(":")[0] == db.split(":")[0]:
            return (
                Cause(
                    "device_index",
                    "device index",
                    "The device index is part of the key: launch each rank with CUDA_VISIBLE_DEVICES=<local "
                    "rank> so every rank compiles for cuda:0, or keep per-rank caches.",
                ),
                f"input {index} on {da} vs {db}",
            )
        return cause_of(name), f"input {index} on {da} vs {db}"
    if changed:
        field = "shape" if "shape" in changed else sorted(changed)[0]
        return cause_of(name), f"input {index} {field} {fa[field]} vs {fb[field]}"
    return cause_of(name), f"input {index} metadata differs"


def _difference(name: str, a: tuple[str, str] | None, b: tuple[str, str] | None) -> KeyDifference:
    va, vb = (a or ("", "(absent)"))[1], (b or ("", "(absent)"))[1]
    if name.startswith("example_inputs") and a and b:
        cause, detail = _input_difference(name, va, vb)
    else:
        cause = cause_of(name)
        shown = name not in ("torch_version", "gm") and va != vb
        generic = cause.category in ("inductor_config", "functorch_config", "compile_options", "other")
        setting = f" {name[name.find('[') + 1 : -1] if '[' in name else name}" if generic else ""
        detail = f"{cause.label}{setting}: {va} vs {vb}" if shown else f"{cause.label}{setting} differs"
    return {
        "component": name,
        "category": cause.category,
        "label": cause.label,
        "detail": detail,
        "a": va[:200],
        "b": vb[:200],
        "fix": cause.fix,
    }


def compare_keys(a: CacheLookup, b: CacheLookup) -> list[KeyDifference]:
    """The components whose hashes differ between two lookups (empty if none was recorded)."""
    ca, cb = _components(a), _components(b)
    return [
        _difference(name, ca.get(name), cb.get(name))
        for name in [*ca, *(n for n in cb if n not in ca)]
        if (ca.get(name) or ("",))[0] != (cb.get(name) or ("",))[0]
    ]


def _match(
    a: Sequence[CacheLookup], b: Sequence[CacheLookup]
) -> tuple[list[tuple[CacheLookup, CacheLookup]], list[CacheLookup], list[CacheLookup]]:
    """Pair lookups by (compile id, cache, n-th lookup of that pair), then the rest by cache and order."""

    def keyed(lookups: Sequence[CacheLookup]) -> dict[tuple[str, str, int], CacheLookup]:
        seen: dict[tuple[str, str], int] = defaultdict(int)
        out = {}
        for x in lookups:
            k = (x.compile_id, x.cache)
            out[(x.compile_id, x.cache, seen[k])] = x
            seen[k] += 1
        return out

    ka, kb = keyed(a), keyed(b)
    pairs = [(ka[k], kb[k]) for k in ka if k in kb]
    left_a = [x for k, x in ka.items() if k not in kb]
    left_b = [x for k, x in kb.items() if k not in ka]
    for cache in sorted({x.cache for x in left_a}):
        ra = [x for x in left_a if x.cache == cache]
        rb = [x for x in left_b if x.cache == cache]
        matched = list(zip(ra, rb))
        pairs += matched
        left_a = [x for x in left_a if all(x is not p for p, _ in matched)]
        left_b = [x for x in left_b if all(x is not q for _, q in matched)]
    return pairs, left_a, left_b


def _lookup_ref(x: CacheLookup) -> LookupRef:
    return {
        "rank": x.rank,
        "compile_id": x.compile_id,
        "cache": x.cache,
        "status": x.status,
        "key": x.key,
        "step": x.step,
    }


def saved_by(events: Sequence[Event]) -> dict[int, float]:
    """For each cache lookup among ``events`` (a rank's log, in its order; by ``id``), the latest its
    entry can have reached the cache: the end of the step that looked it up (a forward's entries are
    saved as it compiles, an AOTAutograd entry once the backward has compiled in that step), else the
    end of the run; absent where the log ends first (the entry may never have been saved)."""
    out: dict[int, float] = {}
    waiting: list[CacheLookup] = []
    for event in events:
        if isinstance(event, CacheLookup):
            waiting.append(event)
        elif isinstance(event, (Step, End)) and waiting:
            out.update((id(x), event.t) for x in waiting)
            waiting = []
    return out


def explain_misses(a: Sequence[Event], b: Sequence[Event]) -> MissExplanation:
    """Why the cache lookups among the events ``b`` (a later run, or another rank: its log) could not
    reuse the entries made by the lookups among ``a``.

    Returns ``pairs`` (each matched lookup with its differing components, or why it bypassed the
    cache), ``causes`` (each distinct cause once, with the lookups it explains and its fix, most
    frequent first), ``keys_differ`` and ``bypassed`` (counts of pairs), ``only_a`` / ``only_b``
    (lookups with no counterpart: a compile one run did and the other did not),
    ``same_key_misses`` (b missed with a's very key after a's entry was saved: the entry was not in
    b's cache directory), ``beside_misses`` (b missed with a's key before a's entry can have been
    saved, :func:`saved_by`: runs side by side, or b ran first; no cache could serve it) and
    ``probe_misses`` (b's entry was there; its graph probe made the lookup a miss, :data:`PROBE_MISS`).

    >>> result = explain_misses(run_a.logs[0].events, run_b.logs[0].events)  # doctest: +SKIP
    >>> [c["label"] for c in result["causes"]]  # doctest: +SKIP
    ['CPU thread count (OMP_NUM_THREADS / torch.set_num_threads)']
    """
    saved = saved_by(a)
    lookups_a = [x for x in a if isinstance(x, CacheLookup)]
    lookups_b = [x for x in b if isinstance(x, CacheLookup)]
    pairs, only_a, only_b = _match(lookups_a, lookups_b)
    fx_diffs: dict[str, list[KeyDifference]] = defaultdict(list)
    rows: list[LookupPair] = []
    for x, y in pairs:
        bypass = [
            f"{side} bypassed the cache ({z.reason or 'no reason recorded'})"
            for side, z in (("A", x), ("B", y))
            if z.status == "bypass"
        ]
        diffs = compare_keys(x, y) if x.key != y.key and not bypass else []
        if x.cache == "fxgraph":
            fx_diffs[x.compile_id].extend(diffs)
        rows.append(
            {
                "a": _lookup_ref(x),
                "b": _lookup_ref(y),
                "same_key": x.key == y.key and x.key is not None,
                "bypass": bool(bypass),
                "differences": diffs,
                "note": "; ".join(bypass) or None,
            }
        )
    for row in rows:  # key differs, nothing recorded: borrow the same compile's FX-graph differences
        if not row["same_key"] and not row["bypass"] and not row["differences"]:
            borrowed = {d["component"]: d for d in fx_diffs.get(row["a"]["compile_id"], [])}
            row["differences"] = list(borrowed.values())
            row["note"] = _NO_COMPONENTS + (
                "; the FX-graph lookups of the same compile differ as shown" if borrowed else ""
            )
    causes: dict[str, MissCause] = {}
    for index, row in enumerate(rows):
        for d in row["differences"]:
            entry = causes.setdefault(d["detail"], {**d, "lookups": []})
            entry["lookups"].append(index)
    # b missed a's very key: the probe's doing, a's entry not saved yet (side by side), or not where b looked
    missed = [(x, y) for row, (x, y) in zip(rows, pairs) if row["same_key"] and y.status == "miss"]
    probed = [(x, y) for x, y in missed if y.reason == PROBE_MISS]
    beside = [(x, y) for x, y in missed if y.reason != PROBE_MISS and y.t < saved.get(id(x), math.inf)]
    return {
        "pairs": rows,
        "causes": sorted(causes.values(), key=lambda c: -len(c["lookups"])),
        "same_key_misses": len(missed) - len(probed) - len(beside),
        "beside_misses": len(beside),
        "probe_misses": len(probed),
        "keys_differ": sum(not row["same_key"] and not row["bypass"] for row in rows),
        "bypassed": sum(row["bypass"] for row in rows),
        "only_a": [_lookup_ref(x) for x in only_a],
        "only_b": [_lookup_ref(x) for x in only_b],
        "lookups": {"a": _counts(lookups_a), "b": _counts(lookups_b)},
    }


def _counts(lookups: Sequence[CacheLookup]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for x in lookups:
        out[x.status] += 1
    return dict(out)


def key_findings(
    a: Sequence[Event], b: Sequence[Event], label_a: str = "run A", label_b: str = "run B"
) -> list[Finding]:
    """``CACHE_KEY_DIFFERS`` findings (one per cause) for lookups of ``b`` (a log's events) that could
    not hit ``a``'s entries; ``CACHE_SAME_KEY_MISSED`` when ``b`` missed keys ``a`` had saved
    (another cache directory); ``CACHE_MISSED_BY_TORCHREPRO`` for the misses torchrepro itself caused
    (runs side by side, its graph probe), which blame no cache setup.

    >>> key_findings(run_a.logs[0].events, run_b.logs[0].events)  # doctest: +SKIP
    """
    result = explain_misses(a, b)
    findings = [
        Finding(
            "CACHE_KEY_DIFFERS",
            "warning",
            f"{label_b} cannot reuse {label_a}'s compiled graphs: {c['detail']}",
            hint=c["fix"],
            evidence={
                "component": c["component"],
                "a": c["a"],
                "b": c["b"],
                "lookups": len(c["lookups"]),
                "compile_ids": sorted({result["pairs"][i]["b"]["compile_id"] for i in c["lookups"]}),
            },
        )
        for c in result["causes"]
    ]
    if result["same_key_misses"]:
        findings.append(
            Finding(
                "CACHE_SAME_KEY_MISSED",
                "info",
                f"{label_b} missed {result['same_key_misses']} lookup(s) with the same key as {label_a}",
                hint="The key matched, so the entry was not in the cache directory the second run used: a different "
                "TORCHINDUCTOR_CACHE_DIR (per-rank directories?), a cleared cache, or an entry never saved "
                "(look for bypasses). Share or pack the cache: torchrepro cache pack/unpack.",
                evidence={"lookups": result["same_key_misses"]},
            )
        )
    beside, probed = result["beside_misses"], result["probe_misses"]
    if beside or probed:
        said = [
            f"{beside} before {label_a} had saved the same graph (the runs ran side by side, or {label_b} ran "
            "first: no cache could have served them)"
            if beside
            else "",
            f"{probed} that torchrepro's graph probe made misses (the entries were there; the probe compiled "
            "again the graphs it kept no copy of)"
            if probed
            else "",
        ]
        findings.append(
            Finding(
                "CACHE_MISSED_BY_TORCHREPRO",
                "info",
                f"{label_b} missed {beside + probed} lookup(s) with {label_a}'s keys because of torchrepro's own "
                "runs: " + "; ".join(x for x in said if x),
                hint="Nothing in your cache setup is to blame for these. TORCHREPRO_CHECK_SIDE_BY_SIDE=0 runs the "
                "runs one after the other.",
                evidence={"beside": beside, "probe": probed},
            )
        )
    return findings


def rank_key_findings(logs: Sequence[EventLog]) -> list[Finding]:
    """Cross-rank key differences in one run: every rank compared with the lowest rank.

    >>> rank_key_findings(load_run("runs/ddp").logs)  # doctest: +SKIP
    """
    ranked = sorted((log for log in logs if log.of(CacheLookup)), key=lambda log: log.rank)
    if len(ranked) < 2:
        return []
    base = ranked[0]
    findings = []
    for log in ranked[1:]:
        for f in key_findings(base.events, log.events, f"rank {base.rank}", f"rank {log.rank}"):
            if f.code == "CACHE_KEY_DIFFERS":
                findings.append(f)
    return findings


def warm_start_findings(meta: Mapping[str, object]) -> list[Finding]:
    """``WARM_START_SKIPPED``: the command kept its ``--warm-from`` pack from the runs, which compiled
    cold (``meta["warm_start_skipped"]``, the reason: a pack signed by no trusted key, or unsigned);
    said once on the terminal as a warning line, and in every report of the command as this finding."""
    why = meta.get("warm_start_skipped")
    if not isinstance(why, str):
        return []
    return [
        Finding(
            "WARM_START_SKIPPED",
            "warning",
            f"--warm-from skipped, compiled cold: {why}",
            hint="A compile cache is code: sign the pack (torchrepro cache pack --sign KEY) and list KEY.pub in "
            "TORCHREPRO_TRUSTED_KEYS, or pass --allow-unsigned for a pack you made yourself.",
            evidence={"why": why},
        )
    ]
