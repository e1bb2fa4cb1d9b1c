"""Fingerprints: bitwise, canonical, stable across processes, and side-effect free."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import random
from typing import NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from torchrepro.digests import _device_digest, fingerprint, fingerprints, hash_bytes, stable_uid

fast = settings(max_examples=60, deadline=None)

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.float8_e4m3fn,
]
# The two tensor paths: xxh3 over the bytes (CPU) and the on-device sums, run here on CPU.
DIGESTS = [fingerprint, _device_digest]


@st.composite
def tensors(draw, dtypes=DTYPES, min_numel=0):
    """A tensor of any listed dtype and a small shape, with arbitrary (valid) bytes."""
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(st.lists(st.integers(1 if min_numel else 0, 5), max_size=3))
    numel = int(np.prod(shape))
    assume(numel >= min_numel)
    size = numel * dtype.itemsize
    data = draw(st.binary(min_size=size, max_size=size))
    if dtype == torch.bool:
        data = bytes(b & 1 for b in data)
    return torch.tensor(list(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _views(base: torch.Tensor) -> list[torch.Tensor]:
    """Non-contiguous or offset views of a 2-D tensor."""
    return [base.T, base[::2], base[:, 1::2], base[1:, 1:], base.unsqueeze(0).expand(2, *base.shape)]


def _flip(t: torch.Tensor, bit: int) -> torch.Tensor:
    out = t.clone()
    out.reshape(-1).view(torch.uint8)[bit // 8] ^= 1 << (bit % 8)
    return out


# ---------------------------------------------------------------- tensors, both paths


@pytest.mark.parametrize("digest", DIGESTS)
@fast
@given(tensors(dtypes=[d for d in DTYPES if d != torch.bool], min_numel=1), st.data())
def test_any_single_bit_flip_changes_the_digest(digest, t, data):
    bit = data.draw(st.integers(0, t.numel() * t.dtype.itemsize * 8 - 1))
    assert digest(_flip(t, bit)) != digest(t)


@pytest.mark.parametrize("digest", DIGESTS)
@fast
@given(tensors(dtypes=[torch.bool], min_numel=1), st.data())
def test_bool_flips_change_the_digest(digest, t, data):
    # Only bit 0 of a bool byte keeps it a valid bool; all bits are tested on the uint8 view.
    bit = data.draw(st.integers(0, t.numel() - 1)) * 8
    assert digest(_flip(t, bit)) != digest(t)
    u = t.view(torch.uint8)
    assert digest(_flip(u, bit + data.draw(st.integers(0, 7)))) != digest(u)


@pytest.mark.parametrize("digest", DIGESTS)
@fast
@given(tensors())
def test_equal_content_gives_equal_digest(digest, t):
    rebuilt = torch.tensor(t.reshape(-1).view(torch.uint8).tolist(), dtype=torch.uint8)
    assert digest(t) == digest(t.clone()) == digest(rebuilt.view(t.dtype).reshape(t.shape))


@pytest.mark.parametrize("digest", DIGESTS)
@fast
@given(st.integers(2, 6), st.integers(2, 6), st.sampled_from(DTYPES[:7]), st.integers(0, 2**31))
def test_views_hash_by_logical_content(digest, rows, cols, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 100, (rows, cols), generator=g).to(dtype)
    for view in _views(base):
        assert digest(view) == digest(view.contiguous())
    if not torch.equal(base, base.T) and rows == cols:
        assert digest(base.T) != digest(base)


@pytest.mark.parametrize("digest", DIGESTS)
@fast
@given(st.binary(min_size=8, max_size=8))
def test_dtype_and_shape_are_part_of_the_digest(digest, data):
    raw = torch.tensor(list(data), dtype=torch.uint8)
    same_bytes = [
        raw,
        raw.view(2, 4),
        raw.view(4, 2),
        raw.view(1, 8),
        raw.view(torch.int8),
        raw.view(torch.float32),
        raw.view(torch.int32),
        raw.view(torch.float64),
        raw.view(torch.float64).reshape(()),
        raw.view(torch.bfloat16),
    ]
    assert len({digest(t) for t in same_bytes}) == len(same_bytes)


@pytest.mark.parametrize("digest", DIGESTS)
def test_empty_and_zero_dim_tensors(digest):
    empties = [torch.zeros(0), torch.zeros(0, 3), torch.zeros(3, 0), torch.zeros(0, dtype=torch.int64)]
    assert len({digest(t) for t in empties}) == len(empties)
    assert digest(torch.tensor(1.0)) != digest(torch.tensor([1.0]))


@pytest.mark.parametrize("digest", DIGESTS)
def test_signed_zeros_and_nan_payloads_compare_by_bits(digest):
    assert digest(torch.tensor([0.0])) != digest(torch.tensor([-0.0]))
    nan = torch.tensor([0x7FC00000, 0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert digest(nan[:1]) != digest(nan[1:])
    assert digest(nan[:1]) == digest(nan[:1].clone())


@pytest.mark.parametrize("digest", DIGESTS)
def test_digest_does_not_perturb_anything(digest):
    w = torch.randn(4, 3, requires_grad=True)
    views = [w, w.T, w[1:]]
    before = (torch.get_rng_state(), [v._version for v in views], w.detach().clone())
    for v in views:
        digest(v)
        digest(v * 2)
    assert torch.equal(torch.get_rng_state(), before[0])
    assert [v._version for v in views] == before[1]
    assert torch.equal(w.detach(), before[2]) and w.grad is None


def test_conjugate_and_negative_views_hash_by_value():
    z = torch.tensor([1 + 2j, -3j])
    for digest in DIGESTS:
        assert digest(z.conj()) == digest(z.conj().resolve_conj())
        assert digest(z.conj()) != digest(z)
        assert z.conj().imag.is_neg() and digest(z.conj().imag) == digest(-z.imag)


# ---------------------------------------------------------------- the device path


@fast
@given(tensors(), st.integers(1, 5))
def test_device_digest_does_not_depend_on_chunking(t, chunk_words):
    assert _device_digest(t, chunk_words=chunk_words) == _device_digest(t)


@fast
@given(tensors(dtypes=[torch.uint8, torch.float16], min_numel=2))
def test_device_digest_of_a_misaligned_view(t):
    # Starts 1 or 2 bytes into the storage: the int64 words must be realigned, not rejected.
    view = t.reshape(-1)[1:]
    assert _device_digest(view, chunk_words=2) == _device_digest(view.clone())


@fast
@given(tensors(dtypes=[torch.float64, torch.int64], min_numel=2), st.data())
def test_device_digest_sees_changes_a_plain_weighted_sum_misses(t, data):
    # Flipping bit 63 of two words adds 2^63 * (a_i + a_j) = 0 mod 2^64 to the linear sum,
    # e.g. negating two float64 values; the mixed second sum must still change.
    i, j = data.draw(st.lists(st.integers(0, t.numel() - 1), min_size=2, max_size=2, unique=True))
    flipped = _flip(_flip(t, 64 * i + 63), 64 * j + 63)
    assert _device_digest(flipped) != _device_digest(t)
    swapped = t.clone().reshape(-1)
    swapped[[i, j]] = swapped[[j, i]]
    assert torch.equal(swapped, t.reshape(-1)) or _device_digest(swapped) != _device_digest(t.reshape(-1))


@fast
@given(tensors(dtypes=[torch.float32, torch.bfloat16, torch.uint8], min_numel=2), st.data())
def test_two_bit_flips_change_both_digests(t, data):
    nbits = 8 * t.numel() * t.dtype.itemsize
    bits = data.draw(st.lists(st.integers(0, nbits - 1), min_size=2, max_size=2, unique=True))
    for digest in DIGESTS:
        assert digest(_flip(_flip(t, bits[0]), bits[1])) != digest(t)


@fast
@given(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20), st.data())
def test_int64_arithmetic_wraps_mod_2_64(xs, data):
    # The device digest relies on two's complement wrap-around for mul, add and sum.
    ys = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=len(xs), max_size=len(xs)))
    a, b = torch.tensor(xs), torch.tensor(ys)

    def signed(v: int) -> int:
        v %= 2**64
        return v - 2**64 if v >= 2**63 else v

    assert (a * b).tolist() == [signed(x * y) for x, y in zip(xs, ys)]
    assert (a * b).sum().item() == signed(sum(x * y for x, y in zip(xs, ys)))
    assert ((a >> 29) & (2**35 - 1)).tolist() == [(x % 2**64) >> 29 for x in xs]


def test_int64_wraps_like_uint64_on_long_vectors():
    # Long enough for the vectorized kernels; numpy's uint64 arithmetic wraps by definition.
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 2**64, 100_003, dtype=np.uint64) for _ in range(2))
    with np.errstate(over="ignore"):
        expected = (a * b).sum(dtype=np.uint64).view(np.int64)
    assert (torch.from_numpy(a.view(np.int64)) * torch.from_numpy(b.view(np.int64))).sum().item() == expected


def test_device_digest_of_a_large_tensor_is_chunked_and_exact():
    t = torch.arange(3 * 2**20 + 3, dtype=torch.int16)
    assert _device_digest(t, chunk_words=2**16) == _device_digest(t)
    assert _device_digest(_flip(t, 8 * t.numel())) != _device_digest(t)


# ---------------------------------------------------------------- stable_uid


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Pair(NamedTuple):
    a: object
    b: object


@dataclasses.dataclass
class Config:
    a: object
    b: object


scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3) | st.binary(max_size=3)
)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=2) | st.integers(), inner, max_size=3)
        | st.frozensets(st.text(max_size=2) | st.integers(), max_size=3)
    ),
    max_leaves=8,
)


def _shuffled(x, rng: random.Random):
    """An equal copy of `x` with every dict built in a different key order."""
    if isinstance(x, dict):
        items = list(x.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(x, (list, tuple)):
        return type(x)(_shuffled(v, rng) for v in x)
    return x


@fast
@given(plain, st.integers(0, 2**32))
def test_stable_uid_ignores_dict_key_order(x, seed):
    assert stable_uid(_shuffled(x, random.Random(seed))) == stable_uid(x)


@fast
@given(plain, plain)
def test_equal_uids_only_for_equal_values(x, y):
    if stable_uid(x) == stable_uid(y):
        assert x == y and type(x) is type(y)


def test_types_are_part_of_the_uid():
    values = [
        1,
        1.0,
        True,
        "1",
        b"1",
        (1,),
        [1],
        {1},
        frozenset({1}),
        np.int64(1),
        torch.tensor(1),
        Color.RED,
        None,
        0,
        0.0,
        -0.0,
        False,
        (),
        [],
        {},
        "",
        b"",
    ]
    assert len({stable_uid(v) for v in values}) == len(values)


def test_structures_never_share_an_encoding():
    values = [
        ["a", "b"],
        ["ab"],
        [["a"], "b"],
        ["a", ["b"]],
        [["a", "b"]],
        {"a": "b"},
        {"ab": None},
        ("a", "b"),
        Pair("a", "b"),
        Config("a", "b"),
        {"a": "a", "b": "b"},
        [[], []],
        [[[]]],
    ]
    assert len({stable_uid(v) for v in values}) == len(values)


def test_stable_uid_of_sets_enums_dataclasses_and_namedtuples():
    assert stable_uid({"b", "a", "c"}) == stable_uid({"c", "a", "b"})
    assert stable_uid(Config(1, [2])) == stable_uid(Config(1, [2])) != stable_uid(Config(1, [3]))
    assert stable_uid(Pair(1, 2)) != stable_uid((1, 2))
    assert stable_uid(Color.RED) != stable_uid(Color.BLUE)
    assert stable_uid(float("nan")) == stable_uid(float("nan"))
    assert stable_uid(torch.float32) != stable_uid(torch.device("cpu")) != stable_uid("cpu")
    assert stable_uid(2**100) != stable_uid(2**100 + 1) != stable_uid(-(2**100) - 1)


def test_stable_uid_rejects_state_and_unknown_objects():
    model = torch.nn.Linear(2, 2)
    for bad in [model, torch.optim.SGD(model.parameters(), lr=0.1), object(), [object()]]:
        with pytest.raises(TypeError):
            stable_uid(bad)
    with pytest.raises(TypeError):
        fingerprint(object())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_tensors_without_row_major_bytes_are_a_type_error():
    """Sparse and nested tensors (a DataLoader may yield either): a TypeError, which step capture
    records as an unhashable batch, not another error that would stop capture."""
    nested = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])
    for bad in [torch.eye(3).to_sparse(), nested, [torch.ones(2), nested]]:
        with pytest.raises(TypeError, match="cannot fingerprint a (torch.sparse_coo|nested) tensor"):
            fingerprint(bad)


@fast
@given(plain)
def test_fingerprint_agrees_with_stable_uid_on_plain_data(x):
    assert fingerprint(x) == stable_uid(x)


def test_nested_batches_with_tensors_and_arrays():
    torch.manual_seed(0)
    batch = {"x": torch.randn(2, 3), "y": np.arange(3), "meta": Pair("id", 7)}
    same = {"meta": Pair("id", 7), "y": np.arange(3), "x": batch["x"].T.contiguous().T}
    assert fingerprint(batch) == fingerprint(same)
    assert fingerprint(batch) != fingerprint({**batch, "y": np.arange(3).astype(np.int32)})
    assert fingerprint(np.arange(6).reshape(2, 3).T) == fingerprint(np.arange(6).reshape(2, 3).T.copy())
    assert fingerprint(np.float32(1)) != fingerprint(np.float64(1)) != fingerprint(1.0)


# ---------------------------------------------------------------- modules and optimizers


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    m.register_buffer("scale", torch.ones(2), persistent=False)
    return m


def test_module_fingerprint_changes_with_any_parameter_or_buffer():
    model = _model()
    before, names = fingerprint(model), fingerprints(model)
    assert list(names) == [
        "0.weight",
        "0.bias",
        "1.weight",
        "1.bias",
        "2.weight",
        "2.bias",
        "scale",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        saved = t.detach().clone()
        with torch.no_grad():
            t.view(-1)[0] += 1
        after = fingerprints(model)
        assert fingerprint(model) != before
        assert [n for n in names if after[n] != names[n]] == [name]
        with torch.no_grad():
            t.copy_(saved)
        assert fingerprint(model) == before


def test_module_fingerprint_matches_copies_state_dicts_and_compiled_wrappers():
    model = _model()
    assert fingerprint(copy.deepcopy(model)) == fingerprint(model)
    assert fingerprint(_model()) == fingerprint(model)
    state = fingerprints(model.state_dict())
    assert state == {k: v for k, v in fingerprints(model).items() if k != "scale"}
    assert fingerprints(model)["0.weight"] == fingerprint(model[0].weight)
    compiled = torch.compile(model)  # wraps only; nothing compiles until it is called
    assert fingerprint(compiled) == fingerprint(model) and fingerprints(compiled) == fingerprints(model)


def test_optimizer_fingerprint_follows_state_and_hyperparameters():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fresh = fingerprint(opt)
    model(torch.randn(5, 3)).sum().backward()
    opt.step()
    stepped = fingerprint(opt)
    assert stepped != fresh
    clone = torch.optim.AdamW(model.parameters(), lr=1e-3)
    clone.load_state_dict(opt.state_dict())
    assert fingerprint(clone) == stepped
    opt.param_groups[0]["lr"] = 2e-3
    assert fingerprint(opt) != stepped
    assert "state.0.exp_avg" in fingerprints(opt)


# ---------------------------------------------------------------- stability across processes

BUILD = """
import torch
from torchrepro.digests import fingerprint, stable_uid
torch.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))
batch = {"x": torch.randn(4, 8), "tags": {"alpha", "beta", "gamma", "delta"}, "n": (1, 2.5, None)}
result = [fingerprint(model), fingerprint(batch), fingerprint(torch.randn(3, 5).T), stable_uid(batch["tags"])]
"""


def test_stable_across_processes_and_hash_seeds(run_python):
    outs = [
        json.loads(run_python(BUILD + "print(__import__('json').dumps(result))", env={"PYTHONHASHSEED": seed}).stdout)
        for seed in ("1", "2")
    ]
    here: dict = {}
    exec(BUILD, here)
    assert outs[0] == outs[1] == here["result"]


def test_format_is_fixed():
    # Golden values: a change here changes every stored fingerprint.
    assert hash_bytes(b"ab", b"c") == hash_bytes(b"abc") == "06b05ab6733a618578af5f94892f3950"
    assert stable_uid({"b": [1, 2.0], "a": ("x", None, True)}) == "bee6971c1b6118fe6907b9cc8d3e32d0"
    table = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert fingerprint(table) == "fa1110324ddfd792f0097b952a19e714"
