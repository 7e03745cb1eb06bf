"""Per-token rate limit of the collector: a token bucket counted in reports (docs/collector.md §7).

A request is let in while the bucket of its token holds at least one report; once its body is
decoded it is charged ``max(1, n)`` reports, which may take the bucket below zero (a large batch
is not refused after it was read; the token waits longer before the next one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """Token buckets keyed by token id.

    Parameters
    ----------
    rate : float
        Reports per second added to each bucket (> 0).
    burst : int
        Bucket capacity in reports (≥ 1); a new bucket starts full.
    clock : callable () → float
        Monotonic seconds (for tests).

    Notes
    -----
    Source: docs/collector.md §7. One bucket per token id in the token file, so the memory is
    bounded by the file; buckets of ids no longer presented stay until the process ends.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        if not burst >= 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        self.rate, self.burst, self._clock = float(rate), float(burst), clock
        self._buckets: dict[str, list[float]] = {}  # id → [level, time of level]

    def _level(self, token_id: str) -> list[float]:
        now = self._clock()
        b = self._buckets.get(token_id)
        if b is None:
            b = self._buckets[token_id] = [self.burst, now]
        else:
            b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
            b[1] = now
        return b

    def retry_after(self, token_id: str) -> int:
        """0 if a request of ``token_id`` may go on, else the whole seconds (≥ 1) until its bucket
        holds one report again."""
        level = self._level(token_id)[0]
        if level >= 1.0:
            return 0
        return max(1, math.ceil((1.0 - level) / self.rate))

    def charge(self, token_id: str, reports: int) -> None:
        """Take ``max(1, reports)`` from the bucket of ``token_id`` (it may go negative)."""
        self._level(token_id)[0] -= max(1, int(reports))

    def level(self, token_id: str) -> float:
        """Reports in the bucket now (negative: in debt)."""
        return self._level(token_id)[0]
