"""The steps.bin codec in C (_stepcodec.c): stepstream._Encoding and stepstream._Records, faster."""

from collections.abc import Callable, Sequence
from typing import Any

VERSION: int
KEYFRAME: bytes
KEYFRAME_EVERY: int
MAX_RECORD: int
MAX_DEPTH: int

class Encoding:
    records: int
    chain: int
    def __init__(self, nfields: int, checked: bool = True) -> None: ...
    def encode(self, values: Sequence[Any], /) -> bytes: ...

class Records:
    damaged: int
    problems: list[str]
    truncated: bool
    def __init__(
        self, nfields: int, build: Callable[[list[Any]], Any], checked: bool = False, offset: int = 0
    ) -> None: ...
    def feed(self, data: bytes, /) -> list[tuple[int, Any]]: ...
    def finish(self) -> list[tuple[int, Any]]: ...
    def fail(self, why: str, /) -> None: ...
