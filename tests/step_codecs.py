"""The two implementations of the steps.bin codec side by side: the C extension
(eventlog/_stepcodec.c) and its Python reference (eventlog/stepstream.py), and values compared bit
for bit (tests/unit/test_step_codec.py, tests/e2e/test_step_codec_runs.py)."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import pytest

from torchrepro.eventlog import stepstream

C = stepstream._C


needs_c = pytest.mark.skipif(C is None, reason="the C step codec was not built here (pip install -e .)")


@contextlib.contextmanager
def implementation(c: bool) -> Iterator[None]:
    """Encoders and decoders made inside use the C codec (``c``) or the Python one."""
    saved = stepstream._C
    stepstream._C = C if c else None
    try:
        yield
    finally:
        stepstream._C = saved


def exact(value: object) -> object:
    """``value`` with every float as its bits (NaN, -0.0 and inf compared exactly)."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value).hex())
    if isinstance(value, (list, tuple)):
        return [exact(v) for v in value]
    if isinstance(value, dict):
        return {k: exact(v) for k, v in value.items()}
    return value
