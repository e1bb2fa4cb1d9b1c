"""`torchrepro check` on third-party trainers, unmodified: Lightning `Trainer`, Hugging Face
`Trainer` (random init, no download). Skipped where the trainer is not installed (the
`thirdparty` extra installs both)."""

from __future__ import annotations

import json

import pytest

from test_verdicts import check


@pytest.mark.slow  # heavy end to end (make test-slow; CI runs both tiers)
def test_lightning_trainer_is_bit_exact_when_seeded(tmp_path):
    pytest.importorskip("lightning")
    proc, report = check(tmp_path, "lightning_single.py", args=(str(tmp_path / "pl"),))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    det = report["determinism"]
    assert det["verdict"] == "bit_exact" and det["steps_compared"] == 6
    assert det["step_clock"] == "optimizer.step()"
    assert all(e["ended_normally"] for e in det["endings"])
    assert json.dumps(report).count("init_params") == 0


def test_hugging_face_model_built_before_trainer_seeds(tmp_path):
    pytest.importorskip("transformers")
    proc, report = check(tmp_path, "hf_model_before_trainer.py", "--no-localize", args=(str(tmp_path / "hf"),))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fd = report["determinism"]["first_divergence"]
    assert fd["what"] == "init_params" and fd["cause"] == "init_params" and fd["before_step"] == 0
    assert fd["module"] == "GPT2LMHeadModel"
    assert "Seed before building the model" in report["findings"][0]["hint"]
