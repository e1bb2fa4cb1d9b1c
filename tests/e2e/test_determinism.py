"""deterministic() applies and restores every switch; audit() reports them; fallback_random matches eager."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
import torch._inductor.config as inductor_config

from torchrepro import determinism
from torchrepro.determinism import CUBLAS_VAR, DeterminismArgumentError, DeterminismWarning, Switch
from torchrepro.determinism import audit, deterministic
from torchrepro.errors import UserError


def _snapshot() -> dict[str, object]:
    """Every global the module touches, read directly from torch (not through torchrepro)."""
    return {
        "cublas": os.environ.get(CUBLAS_VAR),
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "fallback_random": inductor_config.fallback_random,
        "inductor.deterministic": inductor_config.deterministic,
    }


def _put_back(state: dict[str, object]) -> None:
    if state["cublas"] is None:
        os.environ.pop(CUBLAS_VAR, None)
    else:
        os.environ[CUBLAS_VAR] = state["cublas"]
    torch.use_deterministic_algorithms(state["algorithms"], warn_only=state["warn_only"])
    torch.backends.cudnn.deterministic = state["cudnn.deterministic"]
    torch.backends.cudnn.benchmark = state["cudnn.benchmark"]
    inductor_config.fallback_random = state["fallback_random"]
    inductor_config.deterministic = state["inductor.deterministic"]


@pytest.fixture(autouse=True)
def global_state():
    """Process-global settings are put back after every test, whatever the test did."""
    before = _snapshot()
    yield before
    _put_back(before)


@pytest.fixture
def unusual_state(monkeypatch):
    """Non-default values for every switch, so a restore to defaults would be caught."""
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = False
    torch.backends.cudnn.benchmark = True
    inductor_config.fallback_random = False
    inductor_config.deterministic = False
    return _snapshot()


@pytest.fixture
def inductor_cache(tmp_path_factory, monkeypatch):
    """One inductor cache directory for every compiling test: conftest's if it set one."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if root is None:
        root = tmp_path_factory.getbasetemp() / "inductor-cache"
        root.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(root))
    torch._dynamo.reset()
    yield root
    torch._dynamo.reset()


def test_context_manager_sets_then_restores_everything(unusual_state):
    with deterministic() as d:
        assert os.environ[CUBLAS_VAR] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic is True
        assert torch.backends.cudnn.benchmark is False
        assert inductor_config.fallback_random is True
        assert inductor_config.deterministic is True
    assert isinstance(d, deterministic)
    assert _snapshot() == unusual_state
    assert CUBLAS_VAR not in os.environ


def test_restores_when_the_block_raises(unusual_state):
    with pytest.raises(RuntimeError, match="boom"), deterministic(mode="warn"):
        raise RuntimeError("boom")
    assert _snapshot() == unusual_state


def test_existing_cublas_value_is_kept_and_restored(monkeypatch):
    monkeypatch.setenv(CUBLAS_VAR, ":16:8")
    with deterministic():
        assert os.environ[CUBLAS_VAR] == ":16:8"
    assert os.environ[CUBLAS_VAR] == ":16:8"


def test_nested_blocks_restore_in_order(unusual_state):
    with deterministic(mode="strict"):
        with deterministic(mode="warn", compile="native"):
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert inductor_config.fallback_random is True
    assert _snapshot() == unusual_state


def test_function_form_leaves_settings_on():
    deterministic(mode="warn")
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic is True
    assert inductor_config.fallback_random is True
    assert os.environ.get(CUBLAS_VAR) == ":4096:8"


def test_restore_by_hand(unusual_state):
    d = deterministic()
    d.restore()
    assert _snapshot() == unusual_state


@pytest.mark.parametrize(("mode", "warn_only"), [("strict", False), ("warn", True)])
def test_mode_sets_warn_only(mode, warn_only):
    with deterministic(mode=mode):
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled() is warn_only


def test_native_leaves_inductor_rng_alone():
    inductor_config.fallback_random = False
    with deterministic(compile="native"):
        assert inductor_config.fallback_random is False
        assert inductor_config.deterministic is True


@pytest.mark.parametrize("kwargs", [{"mode": "lenient"}, {"compile": "eager"}, {"mode": None}])
def test_bad_arguments_are_user_errors_and_change_nothing(kwargs, global_state):
    with pytest.raises(DeterminismArgumentError) as info:
        deterministic(**kwargs)
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)
    assert "must be" in str(info.value)
    assert _snapshot() == global_state


def test_warns_when_cuda_is_already_initialised(monkeypatch):
    monkeypatch.delenv(CUBLAS_VAR, raising=False)
    monkeypatch.setattr(determinism._CUBLAS_SET_LATE, "value", False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.warns(DeterminismWarning, match="already initialised"), deterministic():
        pass


def test_missing_inductor_config_warns_instead_of_crashing(monkeypatch, unusual_state):
    monkeypatch.setattr(determinism, "_inductor_config", lambda load: None)
    with pytest.warns(DeterminismWarning, match="fallback_random"), deterministic():
        assert torch.are_deterministic_algorithms_enabled()
    after = _snapshot()
    # torch's own use_deterministic_algorithms still writes the real inductor config.
    del after["inductor.deterministic"], unusual_state["inductor.deterministic"]
    assert after == unusual_state


def test_audit_is_json_serialisable_and_complete():
    switches = audit()
    assert all(isinstance(s, Switch) for s in switches)
    names = [s.name for s in switches]
    assert len(names) == len(set(names))
    for expected in (
        "torch.use_deterministic_algorithms",
        "torch.backends.cudnn.deterministic",
        "torch.backends.cudnn.benchmark",
        CUBLAS_VAR,
        "torch.backends.cuda.matmul.allow_tf32",
        "torch.backends.cudnn.allow_tf32",
        "torch.get_float32_matmul_precision()",
        "torch.get_num_threads()",
        "torch.get_num_interop_threads()",
        "cuDNN available",
        "torch._inductor.config.fallback_random",
        "torch._inductor.config.deterministic",
        "PYTHONHASHSEED",
    ):
        assert expected in names
    data = json.loads(json.dumps([dataclasses.asdict(s) for s in switches]))
    assert all(d["status"] in ("ok", "risk", "info") and d["note"] for d in data)


def test_audit_follows_the_switches():
    def by_name() -> dict[str, Switch]:
        return {s.name: s for s in audit()}

    torch.use_deterministic_algorithms(False)
    inductor_config.fallback_random = False
    assert by_name()["torch.use_deterministic_algorithms"].status == "risk"
    assert by_name()["torch._inductor.config.fallback_random"].status == "risk"
    with deterministic():
        now = by_name()
        assert now["torch.use_deterministic_algorithms"].status == "ok"
        assert now["torch.is_deterministic_algorithms_warn_only_enabled()"].status == "ok"
        assert now["torch._inductor.config.fallback_random"].status == "ok"
        assert now["torch._inductor.config.deterministic"].status == "ok"
    with deterministic(mode="warn"):
        assert by_name()["torch.is_deterministic_algorithms_warn_only_enabled()"].status == "risk"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA wording")
def test_audit_says_cuda_switches_do_not_apply_without_cuda():
    with deterministic():
        switches = {s.name: s for s in audit()}
    for name in (CUBLAS_VAR, "torch.backends.cudnn.deterministic", "torch.backends.cuda.matmul.allow_tf32"):
        assert switches[name].status == "info" and not switches[name].in_effect
    assert "no CUDA" in switches[CUBLAS_VAR].note


def test_pythonhashseed_in_audit(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert {s.name: s for s in audit()}["PYTHONHASHSEED"].status == "risk"


def _dropout(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True)


def _compiled_and_eager(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout on 64x64 ones, compiled (fresh, compiled here) and eager, under the same seed."""
    x = torch.ones(64, 64)
    torch._dynamo.reset()
    compiled = torch.compile(_dropout, backend="inductor")
    torch.manual_seed(seed)
    got = compiled(x)
    torch.manual_seed(seed)
    want = _dropout(x)
    return got, want


@pytest.mark.inductor
def test_match_eager_compiled_dropout_equals_eager_bitwise(inductor_cache):
    with deterministic(compile="match-eager"):
        got, want = _compiled_and_eager()
    assert torch.equal(got, want)
    assert 0 < int((want == 0).sum()) < want.numel()  # a real mask, not all kept or all dropped


@pytest.mark.inductor
def test_native_compiled_dropout_differs_from_eager(inductor_cache):
    with deterministic(compile="native"):
        assert inductor_config.fallback_random is False
        got, want = _compiled_and_eager()
    assert got.shape == want.shape
    assert not torch.equal(got, want)
