"""The automatic interval of the parameter fingerprints: capture times its own work over the first
steps and chooses every how many steps parameters are fingerprinted, so that all of capture's
per-step work stays within 1 % of step time. Only arithmetic: the step recorder reads the clock."""

from __future__ import annotations

import math
import statistics

_AUTO_WARMUP = 5  # steps fingerprinted every time while the cost of a fingerprint is measured
_OVERHEAD_BUDGET = 0.01  # automatic interval: all capture work at most 1 % of step time ...
_SAFETY = 2.0  # ... with fingerprints planned at twice their measured cost (first-step timings are noisy)


class FingerprintInterval:
    """``every``: the interval, given (``StepConfig.fingerprint_every``) or, while None, still
    measured; ``own``: capture's own time in the step under way, while it is measured."""

    def __init__(self, every: int | None):
        self.every = every
        self.own = 0.0
        self._step_times: list[float] = []
        self._fp_costs: list[float] = []
        self._own_costs: list[float] = []

    def due(self, index: int) -> bool:
        """Whether step ``index``'s parameters are fingerprinted (every step while measuring)."""
        return self.every is None or index % self.every == 0

    def measured(self, index: int, step_time: float, fp_cost: float, own: float) -> tuple[float, float, float] | None:
        """Take step ``index``'s times (step 0 holds the first compile: left out); once enough are
        taken, choose :attr:`every`: the fixed part (RNG and batch digests, the event) plus
        parameter fingerprints every N steps within 1 % of step time. Returns the medians it chose
        from (a step, a fingerprint, the fixed part), or None while still measuring."""
        if index >= 1:
            self._step_times.append(step_time)
            self._fp_costs.append(fp_cost)
            self._own_costs.append(own)
        if len(self._step_times) < _AUTO_WARMUP:
            return None
        step, cost, fixed = (statistics.median(x) for x in (self._step_times, self._fp_costs, self._own_costs))
        budget = _OVERHEAD_BUDGET * step
        room = max(budget - fixed, budget / 10)
        self.every = max(1, math.ceil(_SAFETY * cost / room))
        return step, cost, fixed
