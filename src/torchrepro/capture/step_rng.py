"""A step's RNG digests: every generator's state fingerprinted once a step (:mod:`torchrepro.rng`),
when its first batch is fetched or else at its first ``backward()``, and their combination
(computed again only when a generator changed)."""

from __future__ import annotations

from typing import Any

from ..rng import combine, live_fingerprints


class StepRng:
    """The RNG digests of the step under way (``fps``, read ``at``), and the last combined."""

    def __init__(self) -> None:
        self.fps: dict[str, str] | None = None
        self.at: str | None = None
        self._last: tuple[dict[str, str] | None, str] = (None, "")  # the last RNG digests and their combination

    def read(self, at: str) -> None:
        """Once per step: the RNG state when its first batch is fetched (a new epoch's iterator
        has drawn its seed by then), else at its first backward() (after any seeding)."""
        if self.fps is None:
            self.fps, self.at = live_fingerprints(), at

    def put(self, event: Any) -> None:
        """The step's RNG digests on its event, if read."""
        if self.fps is not None:
            if self.fps != self._last[0]:  # often no generator changed (no dropout, no augmentation)
                self._last = (self.fps, combine(self.fps))
            event.rng_fps, event.rng_fp, event.rng_at = self.fps, self._last[1], self.at

    def reset(self) -> None:
        self.fps, self.at = None, None
