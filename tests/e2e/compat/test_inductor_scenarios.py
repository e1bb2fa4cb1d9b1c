"""Doctor's counts and categories against Dynamo's own with backend ``inductor`` (the scenario suite,
``tests/e2e/test_doctor_scenarios.py``, uses ``eager`` / ``aot_eager`` to run in seconds): inductor adds the
records the eager backends never write (the backward's own compile, inductor and cache metrics, on torch
2.6 a ``bwd_compilation_metrics`` record per backward), and they must not change what doctor counts.
Each scenario is checked by the suite's own test against Dynamo's counters and compilation metrics.

Marked ``slow`` and ``inductor`` (each compile builds C++ with the system compiler: 10-20 s cold on a
quiet CPU): `make test-slow` runs them on the pinned torch, `make compat` on the oldest and newest."""

from __future__ import annotations

from pathlib import Path

import pytest
import test_doctor_scenarios as suite  # tests/e2e/, on the path as the directory of its conftest.py
import torch

pytestmark = [pytest.mark.inductor, pytest.mark.slow]


def s_dtype() -> None:
    f = torch.compile(suite._twice, backend="inductor")
    f(torch.ones(4))
    f(torch.ones(4, dtype=torch.float64))
    f(torch.ones(4))  # cached


def s_training_step_new_batch_size() -> None:
    """A forward and backward per step: each compile is two inductor compiles (forward, backward)."""
    model = torch.nn.Linear(8, 4)
    f = torch.compile(model, backend="inductor", dynamic=False)
    for batch in (2, 3, 3):  # the third step reuses the second's graphs
        f(torch.ones(batch, 8)).sum().backward()


def s_none_then_bool() -> None:
    @torch.compile(backend="inductor")
    def f(x, flag=None):
        return x - 1 if flag is None else x + 1

    f(torch.ones(4))
    f(torch.ones(4), True)


SCENARIOS = [
    suite.Scenario("inductor-dtype", s_dtype, ["dtype"]),
    suite.Scenario("inductor-training-step-new-batch-size", s_training_step_new_batch_size, ["shape"]),
    suite.Scenario("inductor-none-then-bool", s_none_then_bool, ["python_value"]),
]


@pytest.mark.parametrize("scenario", [s.param() for s in SCENARIOS])
def test_inductor_scenario_matches_dynamo(scenario: suite.Scenario, tmp_path: Path) -> None:
    suite.test_scenario_matches_dynamo(scenario, tmp_path)
