"""The shapes of the JSON that capture writes beside the events and that other modules read: a replay's
``replay[-<rank>].json`` (:class:`Replay`), and the header's capture settings (:class:`CaptureSettings`).

TypedDicts: they cost nothing at run time (the values are plain dicts, written and read as JSON), and
tell the type checker which keys a reader may rely on. A file read back may come from another
torchrepro version: readers still check what they take from it. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, TypedDict

JsonObject = dict[str, Any]  # open JSON: a user's values, or what another program wrote (its keys vary)


class CaptureSettings(TypedDict, total=False):
    """``Header.config``: how this process was captured (``total=False``: a log another version wrote
    may lack a key)."""

    seed: int | None
    compile_mode: str | None  # None (as written) | "eager" | "fallback-random"
    steps: JsonObject  # capture.steps.StepConfig as a dict (its fields change with what steps record)
    rank_from: str  # env | process_group | default (rank 0 of 1: nothing said otherwise)
    source: str  # "TORCH_TRACE": a log translated by `doctor --trace`, not captured live


class NodeInfo(TypedDict):
    """An FX node as a replay names it: its name, target, module (``body.0 (Linear)``) and the user's
    source line (``file:line``)."""

    node: str
    target: str
    module: str | None
    source: str | None


class OpRecord(TypedDict):
    """One aten op of an eager replay's step, with digests of its tensors (``outputs`` None where they
    are no result: uninitialised memory, views, a collective's buffers)."""

    i: int
    op: str
    module: str | None
    phase: str  # forward | backward
    source: str | None
    inputs: list[str | None]
    outputs: list[str | None] | None


class _GraphCheckId(TypedDict):
    compile_id: str


class GraphCheck(_GraphCheckId, total=False):
    """One compiled graph of a compiled replay against its eager FX graph: ``outputs`` compared, the
    random nodes in it, and at the first output that differs (if any) that output's node
    (:class:`NodeInfo`'s keys) and the random nodes it depends on; or ``error``, why the comparison
    itself failed."""

    error: str
    outputs: int
    random_nodes: list[NodeInfo]
    first_differing_output: int
    max_abs: float | None
    node: str
    target: str
    module: str | None
    source: str | None
    depends_on_random: list[NodeInfo]


class _KernelCallDigests(TypedDict):
    compile_id: str
    graph: str  # forward | backward
    inputs: list[str | None]
    outputs: list[str | None]


class KernelCall(_KernelCallDigests, total=False):
    """One call of a compiled graph in a kernel replay: digests of its inputs and outputs; in the
    replayed step also the repeats on the same inputs (output index -> max abs difference, where it
    differed; ``one_thread_differs`` None on one thread), or ``error``, why the repeats failed."""

    threads: int
    repeats: int
    repeat_differs: dict[str, float | None]
    one_thread_differs: dict[str, float | None] | None
    error: str
    at_step: bool  # never written: check's fix ladder marks the replayed step's calls when it reads them


class _ExplainedAt(TypedDict):
    compile_id: str
    graph: str
    output_index: int


class ExplainedOutput(_ExplainedAt, total=False):
    """What one output of a compiled graph is: the parameter whose gradient it is, its FX node, the
    accumulating aten op behind it, the inductor kernel computing it, and the user's source line."""

    parameter: str
    node: str
    output: str
    op: str
    source: str | None
    module: str | None
    accumulating_node: str
    kernel: str
    kernel_fuses: list[str]
    kernel_atomic_add: bool


class KernelSummary(TypedDict):
    """A kernel replay: the replayed step's ``calls`` (with repeats), every call ``before`` it (digests
    only), every output of the graphs called explained (by ``compile_id/graph``), and what failed in
    the localisation itself."""

    calls: list[KernelCall]
    before: list[KernelCall]
    explained: dict[str, list[ExplainedOutput]]
    errors: list[str]


class _ReplayStep(TypedDict):
    step: int


class Replay(_ReplayStep, total=False):
    """A replay file: the step replayed, and what its kind of replay recorded (``ops`` in an eager
    replay, ``graphs`` in a compiled one, ``kernels`` in a kernel replay)."""

    ops: list[OpRecord]
    graphs: list[GraphCheck]
    kernels: KernelSummary


class Hardware(TypedDict):
    """``EnvInfo.hardware``: the machine, its CPUs (those this process may use) and GPUs (their
    names once CUDA is initialised, else ``cuda`` per device)."""

    platform: str
    machine: str
    cpu_count: int | None
    cpus_usable: int | None
    cpu_capability: str
    gpus: list[str]


class Threads(TypedDict):
    """``EnvInfo.threads``: torch's intra- and inter-op thread counts."""

    intra_op: int
    inter_op: int


class SwitchInfo(TypedDict):
    """A determinism switch as ``torchrepro env`` reports it (``torchrepro.determinism.Switch`` as a dict)."""

    name: str
    value: bool | int | str | None
    recommended: bool | int | str | None
    in_effect: bool
    status: str  # ok | risk | info
    note: str


class CacheDirInfo(TypedDict):
    """A compile-cache directory and who may write to it (``capture.environment.CacheDir`` as a dict)."""

    name: str
    path: str
    source: str
    exists: bool
    owner: str | None
    mode: str | None
    note: str
    risks: list[str]


class EnvVarInfo(TypedDict):
    """An environment variable that matters (``capture.environment.EnvVar`` as a dict)."""

    name: str
    value: str | None
    note: str
    risky: bool
    in_fingerprint: bool


class TestedTorch(TypedDict):
    """The range of torch versions tested, and why this torch is outside it (None: inside)."""

    range: list[str]
    outside: str | None


class EnvInfo(TypedDict):
    """What ``torchrepro env`` reports (:func:`torchrepro.capture.environment.collect`, drawn by
    :func:`torchrepro.render.env_text.render_env`); a run's ``Header.env`` holds it as written
    (a :data:`JsonObject` there: a log another version wrote may differ)."""

    torchrepro: str
    versions: dict[str, str]
    hardware: Hardware
    threads: Threads
    determinism: list[SwitchInfo]
    caches: list[CacheDirInfo]
    env_vars: list[EnvVarInfo]
    env_fingerprint: str
    torch_tested: TestedTorch
    step_codec: str  # what writes and reads steps.bin: "C", or "Python (why)" (~10x slower)
