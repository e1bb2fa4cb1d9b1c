"""Many ranks: the world the ranks reported and who is missing from it, how each rank ended
(crash, launcher stop, hang, teardown abort) and what differs between ranks that should agree
(initial parameters, replicated parameters, RNG streams, recompiles, cache decisions, compile
stragglers)."""

from __future__ import annotations

import re
import signal
from array import array
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, TypedDict

from ..eventlog.event_reader import EventLog
from ..eventlog.events import WRITE_FAILED, CacheLookup, Compile, InitParams, Params, World
from .categories import guard_text
from .compile import display_function
from ..eventlog.payloads import JsonObject
from ..reports.findings import Finding
from .kept_steps import KeptSteps
from .rank_groups import rank_ranges, ranks_label

_INTERNAL = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]torchrepro[/\\]|^<")


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Frame(TypedDict):
    """A frame of a stack the supervisor sampled from a hung rank (``run.json``'s ``stall``)."""

    file: str
    line: int
    function: str


class Placement(TypedDict):
    """Where a rank ran: its host, node and local rank there."""

    host: str
    node: int
    local_rank: int


def where(frames: list[Frame]) -> str | None:
    """The first user frame of a stack (most recent first), and the innermost call it waits in."""
    if not frames:
        return None
    user = next((f for f in frames if not _INTERNAL.search(f["file"])), None)
    inner = frames[0]
    text = f"{inner['function']} ({inner['file']}:{inner['line']})"
    if user is not None and user is not inner:
        text = f"{user['file']}:{user['line']} in {user['function']}, waiting in {text}"
    return text


# --- the world ------------------------------------------------------------------------------


def world_size(logs: list[EventLog], meta: JsonObject | None = None) -> int:
    """The job's world size: the largest any source gives, the process groups the ranks joined
    (World events), the launcher's environment at each rank's start (headers) or the launcher
    itself (``run.json``); at least the ranks present.

    >>> world_size(load_run("RUN_DIR").logs)  # doctest: +SKIP
    2
    """
    sizes: list[int] = [w.world_size for log in logs for w in log.of(World)]
    sizes += [log.header.world_size for log in logs if log.header is not None]
    sizes.append(int((meta or {}).get("world_size") or 1))
    return max([*sizes, max((log.rank + 1 for log in logs), default=1)])


MAX_LISTED_RANKS = 1024  # missing ranks listed one by one at most (the rest are said as ranges)


def missing_rank_ranges(logs: list[EventLog], meta: JsonObject | None = None) -> list[range]:
    """Ranks that the world size says exist but that wrote no event log (see :func:`world_size`),
    as ranges between the ranks present: as many as there are ranks present, plus one, however
    large the world size a log claims. A verdict over the others says nothing about them.

    >>> [(r.start, r.stop) for r in missing_rank_ranges([], {"world_size": 10**9})]
    [(0, 1000000000)]
    """
    size = world_size(logs, meta)
    out, start = [], 0
    for rank in sorted({log.rank for log in logs}) + [size]:
        if rank > start:
            out.append(range(start, min(rank, size)))
        start = max(start, rank + 1)
    return [r for r in out if r]


def missing_ranks(logs: list[EventLog], meta: JsonObject | None = None) -> list[int]:
    """The first :data:`MAX_LISTED_RANKS` of :func:`missing_rank_ranges`, one by one.

    >>> run = load_run("RUN_DIR"); missing_ranks(run.logs, run.meta)  # doctest: +SKIP
    [1]
    """
    out: list[int] = []
    for gap in missing_rank_ranges(logs, meta):
        out += gap[: MAX_LISTED_RANKS - len(out)]
    return out


def missing_text(gaps: list[range]) -> str:
    """``"1, 3, 5–999999"``: missing ranks as :func:`missing_rank_ranges` gives them."""
    return ", ".join(str(g.start) if len(g) == 1 else f"{g.start}–{g.stop - 1}" for g in gaps)


def placement(logs: list[EventLog]) -> dict[int, Placement]:
    """Where each rank ran: host, node and local rank, from its World event (the launcher's
    environment) where it says, else from the hosts the ranks reported (nodes numbered in the
    order their lowest rank appears, local ranks in rank order on each host)."""
    hosts: dict[int, str] = {}
    said: dict[int, World] = {}
    for log in sorted(logs, key=lambda log: log.rank):
        worlds = log.of(World)
        if worlds:
            said[log.rank] = worlds[-1]
        hosts[log.rank] = (worlds[-1].host if worlds else "") or (log.header.host if log.header else "")
    order = list(dict.fromkeys(hosts.values()))
    seen: dict[str, int] = defaultdict(int)
    out: dict[int, Placement] = {}
    for rank, host in hosts.items():
        world = said.get(rank)
        node = world.node if world and world.node is not None else order.index(host)
        local = world.local_rank if world and world.local_rank is not None else seen[host]
        seen[host] += 1
        out[rank] = {"host": host, "node": node, "local_rank": local}
    return out


def world_findings(logs: list[EventLog], meta: JsonObject) -> list[Finding]:
    """``RANKS_MISSING``: ranks the world size says exist but that wrote no log."""
    gaps = missing_rank_ranges(logs, meta)
    if not gaps:
        return []
    size, count = world_size(logs, meta), sum(map(len, gaps))
    shown = missing_text(gaps[:20]) + (", ..." if len(gaps) > 20 else "")
    return [
        Finding(
            "RANKS_MISSING",
            "error",
            f"the job has {size} ranks but {count} wrote no event log (rank{'s' if count > 1 else ''} "
            f"{shown}): this report covers {size - count} of {size}",
            hint="A rank without a log was not captured: its node's RUN_DIR/rank-*/ folders were not copied here, it "
            "died before capture started, or it was started outside torchrepro's reach (another Python or "
            "environment without torchrepro, python -I/-S). Nothing is known about the missing ranks.",
            evidence={
                "world_size": size,
                "missing": missing_ranks(logs, meta),
                "missing_count": count,
                "missing_ranges": missing_text(gaps[:MAX_LISTED_RANKS]),
                "ranks_present": sorted(log.rank for log in logs),
            },
        )
    ]


_ABORT_HINT = (
    "A teardown abort after destroy_process_group (seen in ~4 % of 2-rank CPU launches): the run's "
    "results stand. Deleting DDP/optimizer objects and gc.collect() before destroy_process_group avoids it."
)


# how mp.spawn (ProcessExitedException) and torchrun (ChildFailedError) say a rank died by a signal
_RANK_SIGNALLED = re.compile(r"terminated with signal|exitcode\s*:\s*-\d+")


def launcher_finding(run: JsonObject, meta: JsonObject) -> Finding | None:
    """How the launched process ended when it only started the ranks (``mp.spawn``, ``accelerate
    launch``; its log is ``RUN_DIR/launcher/``): a failure there fails the run, unless every rank
    finished and the launcher only reports a rank's signal at exit (a teardown abort)."""
    launcher = meta.get("launcher")
    if not launcher or launcher.get("status") == "ok":
        return None
    error = launcher.get("error") or ""
    evidence = {"launcher": launcher, "stderr_tail": (meta.get("stderr_tail") or [])[-10:]}
    if run["ranks"] and all(r["status"] == "ok" for r in run["ranks"].values()) and _RANK_SIGNALLED.search(error):
        return Finding(
            "RANK_ABORTED_AFTER_COMPLETION",
            "warning",
            f"every rank finished its work, then the process that started them reported: {error}",
            hint=_ABORT_HINT,
            evidence=evidence,
        )
    return Finding(
        "SCRIPT_FAILED",
        "error",
        f"the launched process, which started the ranks, exited with code "
        f"{launcher.get('exit_code')}" + (f": {error}" if error else ""),
        hint="Everything before the failure is analysed; its own log is RUN_DIR/launcher/events.jsonl.",
        evidence=evidence,
    )


_WRITE_ERRORS = {
    "ENOSPC": "the disk was full",
    "EDQUOT": "the disk quota was exceeded",
    "EROFS": "the disk was read-only",
}


def write_failure(name: str, file: str) -> str:
    """``the disk was full (ENOSPC) while writing run.json``: a write that failed, as the supervisor
    (:func:`~torchrepro.eventlog.rundir.record_write_error`) or a rank's capture (an end record of
    status ``write_failed``, ``error`` ``ENOSPC rank-0/events.jsonl``) kept it."""
    return f"{_WRITE_ERRORS.get(name, 'a write failed')} ({name}) while writing {file}"


def log_write_failure(error: str | None) -> str:
    """What a ``write_failed`` end record's ``error`` (``ENOSPC rank-0/events.jsonl``) says, in words."""
    name, _, file = (error or "EIO").partition(" ")
    return write_failure(name, file or "the event log")


def rank_write_failures(logs: list[EventLog]) -> list[str]:
    """Each rank whose capture could not write its log (its end record's status ``write_failed``), in words."""
    return [
        f"rank {log.rank}: {log_write_failure(end.error)}"
        for log in logs
        if (end := log.end) is not None and end.status == WRITE_FAILED
    ]


def fault_findings(run: JsonObject, meta: JsonObject) -> list[Finding]:
    """One finding per rank that did not end well, judged by its last event, not by the launcher;
    and one for the launched process if it only started the ranks and failed."""
    launcher = launcher_finding(run, meta)
    findings = [launcher] if launcher else []
    codes = {int(k): v for k, v in (meta.get("rank_exit_codes") or {}).items()}
    tails = {int(k): v for k, v in (meta.get("rank_stderr_tails") or {}).items()}
    stall, stopped = meta.get("stall"), meta.get("stopped_by")
    if stopped:
        steps = {r: info["last_step"] for r, info in run["ranks"].items()}
        findings.append(
            Finding(
                "RUN_STOPPED",
                "error",
                f"the run was stopped by {stopped} sent to torchrepro (last step "
                + ", ".join(f"rank {r}: {s}" for r, s in steps.items())
                + ")",
                hint="torchrepro forwarded the signal to every process of the job; everything before it is analysed.",
                evidence={"signal": stopped, "last_steps": steps},
            )
        )
    for rank_s, info in run["ranks"].items():
        rank, step = int(rank_s), info["last_step"]
        evidence = {"rank": rank, "last_step": step, "stderr_tail": (tails.get(rank) or [])[-10:]}
        if stall or stopped and info["status"] in ("terminated", "incomplete", "ok"):
            continue  # the hang (or stop) finding says what happened to each rank
        if info["status"] == "ok" and codes.get(rank):
            findings.append(
                Finding(
                    "RANK_ABORTED_AFTER_COMPLETION",
                    "warning",
                    f"rank {rank} finished its work, then the process ended with {_signal_name(codes[rank])}",
                    hint=_ABORT_HINT,
                    evidence=evidence | {"exit_code": codes[rank]},
                )
            )
        elif info["status"] == "terminated":
            alone = run.get("world_size", 1) <= 1
            how = "terminated by a signal" if alone else "stopped by the launcher"
            findings.append(
                Finding(
                    "RANK_TERMINATED",
                    "error" if alone else "warning",
                    f"rank {rank} was {how} after step {step}",
                    hint="Something outside the job (a scheduler, kill) sent it SIGTERM or SIGHUP."
                    if alone
                    else "Another rank failed first; torchrun then stops the others.",
                    evidence=evidence,
                )
            )
        elif info["status"] == WRITE_FAILED:
            findings.append(
                Finding(
                    "EVENT_LOG_WRITE_FAILED",
                    "error",
                    f"rank {rank}: {log_write_failure(info['error'])}; nothing after step {step} was recorded",
                    hint="Free some space (or fix the disk) and run it again for a verdict; the script ran on, "
                    "unrecorded. Everything recorded before is analysed.",
                    evidence=evidence,
                )
            )
        elif info["status"] == "incomplete":
            how = _signal_name(codes.get(rank)) if rank in codes else "no end record"
            findings.append(
                Finding(
                    "RANK_CRASHED",
                    "error",
                    f"rank {rank} died ({how}) after step {step}",
                    hint="Killed from outside (out of memory, a scheduler, a signal) or crashed in native code; its "
                    "events up to the crash are analysed.",
                    evidence=evidence | {"exit_code": codes.get(rank)},
                )
            )
        elif info["status"] == "error":
            findings.append(
                Finding(
                    "SCRIPT_FAILED",
                    "error",
                    f"rank {rank}: the script exited with code {info['exit_code']}"
                    + (f": {info['error']}" if info["error"] else ""),
                    hint="Everything before the failure is analysed.",
                    evidence=evidence | {"exit_code": info["exit_code"]},
                )
            )
    if stall:
        places = {rank: where(frames) for rank, frames in stall.get("stacks", {}).items()}
        lines = [
            f"rank {r} (last step {run['ranks'].get(r, {}).get('last_step')}): {w or 'no stack dumped'}"
            for r, w in sorted(places.items(), key=lambda kv: int(kv[0]))
        ]
        findings.append(
            Finding(
                "RANK_HUNG",
                "error",
                f"no progress for {stall['after_s']:.0f} s; the job was ended. " + "; ".join(lines),
                hint="A rank waits in a collective another rank never reached (different step counts, a rank-dependent "
                "branch, a recompile or exception on one rank). Stacks: RUN_DIR/rank-*/stacks.txt.",
                evidence={"after_s": stall["after_s"], "where": places},
            )
        )
    return findings


# --- what should agree across ranks ---------------------------------------------------------


def _replicated(logs: list[EventLog]) -> bool:
    """Data-parallel replicas: every rank holds plain tensors of the same names and shapes."""
    params = [log.of(Params) for log in logs]
    if not all(params):
        return False
    first = params[0][0]
    return all(
        p[0].names == first.names
        and p[0].shapes == first.shapes
        and not any(k.startswith("dtensor") for k in p[0].kinds)
        for p in params
    )


def _init_findings(logs: list[EventLog]) -> list[Finding]:
    """Full parameters as each rank built them, just before ``fully_shard`` sharded them."""
    calls: dict[int, dict[int, InitParams]] = defaultdict(dict)
    for log in logs:  # (first_forward fingerprints are this rank's shards: compared run to run, not across ranks)
        for i, event in enumerate(e for e in log.of(InitParams) if e.source == "fully_shard"):
            calls[i][log.rank] = event
    for i, by_rank in sorted(calls.items()):
        ref_rank, ref = min(by_rank.items())
        for rank, event in sorted(by_rank.items()):
            differing = [n for n, a, b in zip(ref.names, ref.fps, event.fps) if a != b and "meta" not in (a, b)]
            if differing:
                return [
                    Finding(
                        "INIT_PARAMS_DIFFER",
                        "error",
                        f"ranks {ref_rank} and {rank} built different initial parameters for {event.module} before "
                        f"{event.source} ({len(differing)} of {len(ref.names)} differ, first {differing[0]}): "
                        "training silently mixes both inits",
                        hint="FSDP2 does not broadcast initial parameters. Build on the meta device, fully_shard, "
                        "to_empty, then set_model_state_dict(model, full_state_dict, options=StateDictOptions("
                        "full_state_dict=True, broadcast_from_rank0=True)); or seed every rank alike for init "
                        "(torchrepro.seed_everything does).",
                        evidence={
                            "ranks": [ref_rank, rank],
                            "module": event.module,
                            "parameters": differing[:10],
                            "call": i,
                        },
                    )
                ]
    return []


def _param_findings(logs: list[EventLog], kept: dict[int, KeptSteps]) -> list[Finding]:
    if len(logs) < 2 or not _replicated(logs):
        return []
    names = logs[0].of(Params)[0].names
    ranks = [log.rank for log in logs]
    common, (columns,) = _at_common_steps([kept[r].param_indices for r in ranks], [[kept[r].param_fps for r in ranks]])
    fingerprints = dict(zip(ranks, columns))
    ref_rank = min(fingerprints)
    ref_fps = fingerprints[ref_rank]
    # the ranks whose fingerprints differ somewhere, compared whole: a reader shares what agrees (one
    # list object per step), but each reading process its own, so a rank is compared first with the
    # last rank found to agree (most likely read by the same process: a comparison of identities)
    odd, agreeing = {}, ref_fps
    for rank in sorted(fingerprints):
        column = fingerprints[rank]
        if column == agreeing or (agreeing is not ref_fps and column == ref_fps):
            agreeing = column
        else:
            odd[rank] = column
    for at, index in enumerate(common):
        ref = ref_fps[at]
        for rank, all_fps in odd.items():
            fps = all_fps[at]
            differing = [n for n, a, b in zip(names, ref, fps) if a != b]
            if differing:
                first_step = index == common[0]
                return [
                    Finding(
                        "REPLICAS_DIFFER_FROM_START" if first_step else "REPLICAS_DIVERGE",
                        "error",
                        (
                            f"data-parallel replicas hold different parameters from the first step on (rank {ref_rank} vs "
                            f"{rank}, {len(differing)} parameters, first {differing[0]})"
                            if first_step
                            else f"data-parallel replicas diverged at step {index} (rank {ref_rank} vs {rank}, first "
                            f"{differing[0]})"
                        ),
                        hint=(
                            "Initial parameters differ and nothing synchronised them: DDP(init_sync=False) or a manual "
                            "all-reduce with different seeds. Seed every rank alike for init, or broadcast from rank 0."
                            if first_step
                            else "Replicas must stay identical under DDP: look for rank-dependent updates (gradients not "
                            "all-reduced, a rank-local optimizer step, unsynchronised buffers)."
                        ),
                        evidence={"step": index, "ranks": [ref_rank, rank], "parameters": differing[:10]},
                    )
                ]
    return []


def _at_common_steps(
    indices: list[Sequence[int]], columns: list[list[Sequence[Any]]]
) -> tuple[Sequence[int], list[list[Sequence[Any]]]]:
    """The step indices every rank has (sorted), and each of ``columns`` (per rank, in the order
    of ``indices``, a value per step in log order) at those steps (the last step of an index
    repeated). Indices that count up by one may be ``range`` objects."""
    order = indices[0] if indices else []
    if all(i == order for i in indices) and (type(order) is range or order == sorted(set(order))):
        return order, columns  # every rank the same steps, once each
    common = sorted(set.intersection(*map(set, indices)))
    positions = [dict(zip(of_rank, range(len(of_rank)))) for of_rank in indices]  # an index's last position
    return common, [[[values[at[i]] for i in common] for values, at in zip(column, positions)] for column in columns]


def _rng_findings(logs: list[EventLog], kept: dict[int, KeptSteps]) -> list[Finding]:
    """Different data on each rank but the same torch RNG stream, consumed step after step:
    every rank draws the same dropout masks."""
    if len(logs) < 2:
        return []
    ranks = [log.rank for log in logs]
    common, (streams, batches) = _at_common_steps(
        [kept[r].indices for r in ranks], [[kept[r].torch_streams for r in ranks], [kept[r].batch_fps for r in ranks]]
    )
    if len(common) < 2:
        return []
    first = streams[0]
    same_rng = all(stream == first for stream in streams)  # (arrays: compared as bytes)
    consumed = len(set(first)) > 1
    none = any(None in b for b in batches if type(b) is not array)  # (an array holds no None)
    duplicated = not none and all(b == batches[0] for b in batches)
    findings = []
    # every step a batch of its own on every rank (asked only where it matters: a pass over every step's ranks)
    if same_rng and consumed and not none and all(len(set(at_step)) == len(logs) for at_step in zip(*batches)):
        findings.append(
            Finding(
                "RNG_IDENTICAL_ACROSS_RANKS",
                "warning",
                "every rank draws the same torch random numbers at every step while training on different data: "
                "dropout masks (and any other random op) repeat across ranks",
                hint="Keep the shared stream for initialisation, then give each rank its own for training: "
                "with plan.fork('dropout'): ... (torchrepro.seed_everything), or torch.manual_seed(seed + rank) "
                "after the model is built.",
                evidence={"ranks": [log.rank for log in logs], "steps": len(common)},
            )
        )
    if duplicated:
        findings.append(
            Finding(
                "DUPLICATE_BATCHES_ACROSS_RANKS",
                "warning",
                f"every rank trained on identical batches for all {len(common)} steps",
                hint="Use a DistributedSampler (and sampler.set_epoch(epoch)), or shard the data by rank.",
                evidence={"ranks": [log.rank for log in logs]},
            )
        )
    return findings


# a compile as the ranks compare it: function, first guard that failed, whether it hit the limit
_Signature = tuple[str | None, str | None, bool]


def _signature(c: Compile) -> _Signature:
    return (c.function, c.recompile_reasons[0] if c.recompile_reasons else None, bool(c.limit_hit))


def _asymmetry_findings(logs: list[EventLog]) -> list[Finding]:
    if len(logs) < 2:
        return []
    sequences: dict[int, list[Compile]] = {log.rank: log.of(Compile) for log in logs}
    longest = max(len(s) for s in sequences.values())
    for i in range(longest):
        entries = {r: (s[i] if i < len(s) else None) for r, s in sequences.items()}
        kinds = {r: (_signature(c) if c else None) for r, c in entries.items()}
        if len(set(kinds.values())) == 1:
            continue
        groups: defaultdict[_Signature | None, list[int]] = defaultdict(list)
        for r, k in kinds.items():
            groups[k].append(r)
        # the odd one out: the smallest group; on a tie, the ranks that did compile
        signature, odd = min(groups.items(), key=lambda kv: (len(kv[1]), kv[0] is None))
        others = sorted(set(sequences) - set(odd))
        if signature is None:
            rank, odd, others = others[0], others, odd
        else:
            rank = odd[0]
        c = entries[rank]
        assert c is not None  # rank is among the ranks that compiled this i-th time
        what = "hit the recompile limit for" if c.limit_hit else "recompiled" if c.recompile_reasons else "compiled"
        title = (
            f"rank{'s' if len(odd) > 1 else ''} {rank_ranges(odd)} {what} {display_function(c, sequences[rank])} "
            f"({c.compile_id}) at step {c.step} and rank{'s' if len(others) > 1 else ''} "
            f"{rank_ranges(others)} did not"
            + (f": {guard_text(c.recompile_reasons[0])}" if c.recompile_reasons else "")
        )
        return [
            Finding(
                "RANK_RECOMPILE_ASYMMETRY",
                "error" if c.limit_hit else "warning",
                title,
                hint="The other ranks wait in their next collective while one rank compiles (a straggler, or a hang "
                "if it then takes another code path). Make inputs identical in shape on every rank: drop_last=True "
                "on the DistributedSampler/DataLoader, or pad.",
                evidence={
                    "rank": rank,
                    "step": c.step,
                    "compile_id": c.compile_id,
                    "function": c.function,
                    "reason": c.recompile_reasons[0] if c.recompile_reasons else None,
                    "others": others,
                },
            )
        ]
    return []


def _cache_findings(logs: list[EventLog]) -> list[Finding]:
    decisions = {}
    for log in logs:
        lookups = log.of(CacheLookup)
        if lookups:
            decisions[log.rank] = {
                "hit": sum(x.status == "hit" for x in lookups),
                "miss": sum(x.status == "miss" for x in lookups),
            }
    hitters = sorted(r for r, d in decisions.items() if d["hit"] and not d["miss"])
    missers = sorted(r for r, d in decisions.items() if d["miss"])
    if len(decisions) < 2 or not hitters or not missers:
        return []
    return [
        Finding(
            "CACHE_DECISION_SPLIT",
            "warning",
            f"{ranks_label(hitters)} hit the compile cache, {ranks_label(missers)} missed",
            hint="The ranks compiled with different cache keys or cache contents (per-rank cache directories, a "
            "device index or thread count in the key): the missing ranks compile while the others wait. "
            f"torchrepro cache explain-miss RUN --ranks {hitters[0]} {missers[0]} names the key component.",
            evidence={"per_rank": decisions},
        )
    ]


def _straggler_findings(logs: list[EventLog]) -> list[Finding]:
    if len(logs) < 2:
        return []
    compile_time: dict[tuple[int, int], float] = defaultdict(float)
    for log in logs:
        for c in log.of(Compile):
            if c.step is not None:
                compile_time[(log.rank, c.step)] += c.seconds
    by_step: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for (rank, step), seconds in compile_time.items():
        by_step[step].append((seconds, rank))
    worst = None
    for step, entries in by_step.items():
        entries.sort(reverse=True)
        seconds, rank = entries[0]
        runner_up = entries[1][0] if len(entries) > 1 else 0.0  # ranks without a compile there: 0 s
        skew = seconds - runner_up
        if skew > 0.5 and (worst is None or skew > worst[2]):
            worst = (rank, step, skew)
    if worst is None:
        return []
    rank, step, skew = worst
    return [
        Finding(
            "COMPILE_STRAGGLER",
            "warning",
            f"rank {rank} spent {skew:.1f} s more compiling than the others at step {step}: they waited for it",
            hint="Make every rank compile the same graphs at the same step (see recompile asymmetry), and warm "
            "the cache for all ranks (torchrepro cache pack/unpack).",
            evidence={"rank": rank, "step": step, "extra_compile_s": round(skew, 3)},
        )
    ]


def rank_findings(logs: list[EventLog], kept: dict[int, KeptSteps]) -> list[Finding]:
    """Every cross-rank finding, from the ranks' events and their steps (``kept``: each rank's,
    :func:`~.kept_steps.kept_steps`)."""
    return (
        _init_findings(logs)
        + _param_findings(logs, kept)
        + _rng_findings(logs, kept)
        + _asymmetry_findings(logs)
        + _cache_findings(logs)
        + _straggler_findings(logs)
    )
