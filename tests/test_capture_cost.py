"""Invariants behind capture's low cost (docs/performance.md): the in-place RNG reads give the
official state's bytes, no host reads of step tensors outside the batch point, the event log
survives SIGKILL, and a script that never compiles does not import Dynamo."""

from __future__ import annotations

import random

import numpy as np
import pytest

from torchrepro import rng_raw


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_in_place_rng_reads_equal_the_official_state(seed):
    assert rng_raw._PY_LAYOUT is not None and rng_raw._NP_AUG >= 0, "calibration fell back to the slow path"
    py, npr = random.getstate(), np.random.get_state()
    try:
        random.seed(seed)
        np.random.seed(seed)
        for draw in (lambda: None, random.random, lambda: random.gauss(0, 1), lambda: np.random.rand(7),
                     np.random.standard_normal, np.random.standard_normal, lambda: np.random.seed(seed + 1)):
            draw()
            assert rng_raw.python_state_bytes() == rng_raw.python_bytes(random.getstate())
            _, words, pos, has_gauss, cached = np.random.get_state(legacy=True)
            assert rng_raw.numpy_state_bytes() == rng_raw.numpy_bytes(words.astype("<u4").tobytes(), pos, has_gauss,
                                                                      cached)
    finally:
        random.setstate(py)
        np.random.set_state(npr)
