"""No-op pyplot: any attribute is a function that accepts anything and draws nothing."""

from typing import Any


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def __getattr__(name: str) -> Any:
    return _nothing
