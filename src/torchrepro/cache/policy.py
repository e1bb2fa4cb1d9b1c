"""Which cache directory each rank compiles into, and warm starts before training.

Three policies: ``per-node`` (one directory per machine, shared by its ranks), ``shared`` (one
directory for every rank of every node, e.g. on a shared filesystem) and ``per-rank`` (one per
global rank). The defaults are what measured fastest (docs/cache.md): :func:`configure` uses
``per-node`` (on a cold start the ranks of a machine build each kernel once, not once per rank);
:func:`prewarm` uses ``per-rank`` (a pack removes the compile, and ranks with their own directory
do not wait on each other's kernel locks while loading). Only ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR`` are set, and ``torch._inductor`` is never imported (it would fix the
directory too early).
"""

from __future__ import annotations

import os
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from .._dist import from_env
from ..errors import InputError, UserError

POLICIES = ("per-node", "shared", "per-rank")
DEFAULT_POLICY = "per-node"
PREWARM_POLICY = "per-rank"
# Set by `--cache-policy` (CLI) for the processes it launches: read by `configure_from_env`.
POLICY_VAR, ROOT_VAR, WARM_VAR = "TORCHREPRO_CACHE_POLICY", "TORCHREPRO_CACHE_ROOT", "TORCHREPRO_CACHE_WARM_FROM"
ALLOW_UNSIGNED_VAR = "TORCHREPRO_ALLOW_UNSIGNED"  # "1": prewarm accepts a pack no trusted key signed


@dataclass(frozen=True)
class CachePlan:
    """The directories one process compiles into under a policy."""

    policy: str
    root: Path
    inductor_dir: Path
    triton_dir: Path
    rank: int
    node: str

    def env(self) -> dict[str, str]:
        """The environment variables that put inductor and Triton there."""
        return {"TORCHINDUCTOR_CACHE_DIR": str(self.inductor_dir), "TRITON_CACHE_DIR": str(self.triton_dir)}


def _default_root(environ: Mapping[str, str]) -> Path:
    if environ.get(ROOT_VAR):
        return Path(environ[ROOT_VAR]).absolute()
    if environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(environ["TORCHINDUCTOR_CACHE_DIR"]).absolute()
    from .layout import cache_dir

    return cache_dir()[0]


def plan(
    policy: str = DEFAULT_POLICY, root: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> CachePlan:
    """Where this process (rank from :func:`torchrepro._dist.from_env`, node from ``GROUP_RANK`` or the
    host name) would compile under ``policy``; sets and creates nothing. ``root`` defaults to
    ``TORCHREPRO_CACHE_ROOT`` (which :func:`configure` sets, so calling it again, or in a child
    process, gives the same directory), else ``TORCHINDUCTOR_CACHE_DIR``, else torch's default.

    >>> plan("per-rank", "/scratch/cache", {"RANK": "3"}).inductor_dir
    PosixPath('/scratch/cache/rank-3')
    """
    if policy not in POLICIES:
        raise UserError(f"unknown cache policy {policy!r}: choose one of {', '.join(POLICIES)}")
    environ = os.environ if environ is None else environ
    base = Path(root).expanduser().absolute() if root is not None else _default_root(environ)
    try:
        rank = from_env(environ).rank
    except ValueError as exc:
        raise UserError(str(exc)) from None
    node = environ.get("GROUP_RANK") or socket.gethostname() or "node"
    directory = {"shared": base, "per-node": base / f"node-{node}", "per-rank": base / f"rank-{rank}"}[policy]
    return CachePlan(policy, base, directory, directory / "triton", rank, node)


def _compiles_so_far() -> int:
    """Compile-cache lookups this process has made (0 before torch.compile ran)."""
    from .._compat import dynamo_counters

    counters = dynamo_counters()
    return sum(sum(counters.get(group, {}).values()) for group in ("inductor", "aot_autograd") if group in counters)


def configure(policy: str = DEFAULT_POLICY, root: str | os.PathLike[str] | None = None) -> CachePlan:
    """Point this process's inductor and Triton caches at the policy's directory (created with
    mode 0700 when missing). Call it before the first ``torch.compile`` runs: after that,
    inductor has already used the old directory and :class:`UserError` is raised.

    >>> import torchrepro.cache
    >>> torchrepro.cache.configure("per-node", root="/local/cache")  # doctest: +SKIP
    CachePlan(policy='per-node', ..., inductor_dir=PosixPath('/local/cache/node-host1'), ...)
    """
    chosen = plan(policy, root)
    if _compiles_so_far():
        raise UserError(
            "torchrepro.cache.configure() must run before the first compile: this process already "
            f"used the cache at {os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'the default directory')}"
        )
    chosen.inductor_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _warn_if_others_can_write(chosen.inductor_dir)
    os.environ.update(chosen.env())
    os.environ[ROOT_VAR] = str(chosen.root)
    return chosen


def _warn_if_others_can_write(directory: Path) -> None:
    if not hasattr(os, "geteuid"):
        return
    from ..host.files import cache_risks

    for risk in cache_risks(directory.resolve()):
        warnings.warn(f"torchrepro: {risk}", stacklevel=3)


def prewarm(
    pack: str | os.PathLike[str],
    policy: str = PREWARM_POLICY,
    root: str | os.PathLike[str] | None = None,
    *,
    strict: bool = False,
    trusted: Iterable[str | os.PathLike[str]] | None = None,
    allow_unsigned: bool | None = None,
) -> CachePlan:
    """:func:`configure`, then unpack a warm-start pack into this process's cache directory so
    the first step loads compiled kernels instead of compiling. Ranks that share a directory
    move the files in one after the other (the cache's lock, :mod:`torchrepro.cache.lock`, which
    says on stderr what it waits for and gives up after ``TORCHREPRO_LOCK_TIMEOUT`` s: a cold
    start); files already there are kept. A pack that cannot
    be used (damaged, built for another torch, or not signed by a trusted key) is a warning and a
    cold start, unless ``strict``. Trust is :func:`~torchrepro.cache.archive.unpack`'s: keys from
    ``trusted``, else ``TORCHREPRO_TRUSTED_KEYS``; ``allow_unsigned`` (default: ``TORCHREPRO_ALLOW_UNSIGNED=1``,
    what ``--allow-unsigned`` passes to the ranks) accepts a pack no trusted key signed, with a warning.

    >>> torchrepro.cache.prewarm("warm.tar", root="/local/cache")  # doctest: +SKIP
    """
    from .archive import unpack, unverified

    chosen = configure(policy, root)
    try:
        if allow_unsigned is None:
            allow_unsigned = os.environ.get(ALLOW_UNSIGNED_VAR) == "1"
        result = unpack(pack, into=chosen.inductor_dir, trusted=trusted, allow_unsigned=allow_unsigned)
    except InputError as exc:
        if strict:
            raise
        warnings.warn(f"torchrepro: warm start skipped, compiling cold: {exc}", stacklevel=2)
    else:
        if not result["verified"]:
            warnings.warn(f"torchrepro: {unverified(result)}", UnverifiedPack, stacklevel=2)
    return chosen


class UnverifiedPack(UserWarning):
    """A warm-start pack no trusted key signed, unpacked because unsigned packs were allowed."""


@dataclass(frozen=True)
class WarmStartTrust:
    """What a command says once, before its ranks start, of the signer of its ``--warm-from`` pack:
    ``usable`` (a trusted signer, or any with ``--allow-unsigned``), ``why`` not trusted (None: a
    trusted signer) and the one warning line (None: nothing to say)."""

    usable: bool
    why: str | None = None
    warning: str | None = None


def warm_start_trust(pack: str | os.PathLike[str], allow_unsigned: bool = False) -> WarmStartTrust:
    """Whether the ranks may unpack ``pack`` as far as its signer goes (:func:`prewarm` checks it
    again in each rank, with everything else), and the advice, naming what a command has: the keys
    of ``TORCHREPRO_TRUSTED_KEYS`` and ``--allow-unsigned``.

    >>> warm_start_trust("warm.tar").warning  # doctest: +SKIP
    '--warm-from warm.tar: the pack is unsigned, and a compile cache is code ...'
    """
    from .archive import pack_signer
    from .signing import TRUSTED_VAR, trusted_keys

    try:
        keys = trusted_keys()
        signer = pack_signer(pack)
    except InputError as exc:
        why = str(exc).removeprefix(f"{pack}: ")
        return WarmStartTrust(False, why, f"--warm-from {pack}: {why}; compiling cold")
    if signer in keys:
        return WarmStartTrust(True)
    why = "unsigned" if signer is None else f"signed by {signer}, which is not a key {TRUSTED_VAR} lists"
    if allow_unsigned:
        return WarmStartTrust(True, why, f"--warm-from {pack}: the pack is {why}; unpacked because of --allow-unsigned")
    return WarmStartTrust(
        False,
        why,
        f"--warm-from {pack}: the pack is {why}, and a compile cache is code (torch loads its pickles): compiling "
        f"cold; list its signer's .pub in {TRUSTED_VAR} if you trust it, or pass --allow-unsigned",
    )


def configure_from_env(environ: Mapping[str, str] | None = None) -> CachePlan | None:
    """Apply ``TORCHREPRO_CACHE_POLICY`` / ``_ROOT`` / ``_WARM_FROM`` (what ``--cache-policy``
    passes to the processes it launches); None when no policy is set.

    >>> configure_from_env({"TORCHREPRO_CACHE_POLICY": "per-rank"})  # doctest: +SKIP
    """
    environ = os.environ if environ is None else environ
    policy = environ.get(POLICY_VAR)
    if not policy:
        return None
    root = environ.get(ROOT_VAR) or None
    warm = environ.get(WARM_VAR)
    return prewarm(warm, policy, root) if warm else configure(policy, root)
