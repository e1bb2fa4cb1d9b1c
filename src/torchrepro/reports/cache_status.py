"""What ``torchrepro cache status`` reports (:func:`torchrepro.cache.inventory.status`, rendered by
:mod:`torchrepro.render.cache_text`)."""

from __future__ import annotations

from typing import TypedDict

from ..eventlog.payloads import JsonObject


class Build(TypedDict):
    """What compiled code is tied to: :func:`current_build`'s keys, a pack manifest's ``build``."""

    torch: str
    torch_git: str
    cuda: str | None
    triton: str | None
    python: str
    system: str
    machine: str
    torch_dir: str  # this and the next three: part of every C++ kernel's key (its compile command)
    python_include: str | None
    cpu_capability: str | None
    compiler: str | None


class _CategoryRowBase(TypedDict):
    what: str
    files: int
    bytes: int
    oldest: str | None
    newest: str | None
    oldest_age_s: int
    newest_age_s: int
    unreachable: int


class CategoryRow(_CategoryRowBase, total=False):
    """One kind of entry in a cache: files, bytes, ages, how many are unreachable (and for the FX-graph
    and AOTAutograd entries, how many keys: one key can hold several entries whose guards differ)."""

    keys: int


class UnreachableGroup(TypedDict):
    """The entries of one kind that can never be hit for one reason."""

    category: str
    why: str
    files: int
    bytes: int
    examples: list[str]


class Permissions(TypedDict):
    """Who owns a cache directory and who else could put code into it (``risks``)."""

    owner: str
    mode: str
    precompiled_headers: str | None
    risks: list[str]
    entries_writable_by_others: list[str]
    entries_owned_by_others: list[str]


class CacheTotals(TypedDict):
    files: int
    bytes: int
    unreachable_files: int


class CacheStatus(TypedDict):
    """``torchrepro cache status`` (:func:`torchrepro.cache.inventory.status`, schema
    ``torchrepro.cache-status/1``): counts, sizes and ages by kind, who wrote the entries (what ->
    value -> files), what can never be hit, who can write to the directory, and the findings."""

    schema: str
    path: str
    source: str
    triton_cache_dir: str
    this_build: Build
    totals: CacheTotals
    categories: dict[str, CategoryRow]
    written_by: dict[str, dict[str, int]]
    unreachable: list[UnreachableGroup]
    permissions: Permissions
    findings: list[JsonObject]  # Finding.to_json()
