"""Per-connection limits (docs/wire-protocol.md#11-limits-slow-consumers-drain): a token bucket and a bad-frame counter.

Both are plain synchronous objects with an injectable clock so tests drive time by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up. One frame costs one token."""

    __slots__ = ("_clock", "_last", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()

    def take(self, cost: float = 1.0) -> bool:
        """Spend `cost` tokens if there are enough; False means the frame is rate limited."""
        now = self._clock()
        elapsed = now - self._last
        self._last = now
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False

    @property
    def tokens(self) -> float:
        return self._tokens


class BadFrameCounter:
    """Counts bad frames in a row; a good frame resets it. `limit` in a row means close (1008)."""

    __slots__ = ("count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def bad(self) -> bool:
        """Record a bad frame; True when the limit is reached and the connection must close."""
        self.count += 1
        return self.count >= self.limit

    def good(self) -> None:
        self.count = 0
