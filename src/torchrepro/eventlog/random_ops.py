"""Which aten ops draw random numbers: one predicate for capture (random nodes of a compiled
graph) and analysis (a replayed op that diverged). Plain strings; nothing here imports torch."""

from __future__ import annotations

RANDOM_OPS = (
    "bernoulli",
    "dropout",
    "uniform",
    "normal",
    "rand",
    "randn",
    "randint",
    "randperm",
    "multinomial",
    "exponential",
    "geometric",
    "cauchy",
    "log_normal",
    "random_",
    "poisson",
    "philox",
)


def is_random_op(name: str) -> bool:
    """Whether an aten op draws random numbers (``aten.native_dropout.default`` → True)."""
    base = name.split(".")[1] if "." in name else name
    return any(base.startswith(token) or f"_{token}" in base for token in RANDOM_OPS)
