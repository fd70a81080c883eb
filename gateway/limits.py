"""Limits, read from the settings once, at the edge, and handed down as small frozen values.

- `SessionLimits`: what one connection may hold and send (docs/wire-protocol.md#11-limits-slow-consumers-drain),
  enforced by `gateway.session.Session` with the two counters below.
- `quota_limits`: the limit of every quota (docs/design.md#quotas) for the hosts, the backends and the
  gateway's connection quotas. `actors/` never sees `Settings` (nor imports `gateway/`): it gets this value.
- `TokenBucket` and `BadFrameCounter`: plain synchronous counters with an injectable clock, so tests
  drive time by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from actors.quotas import Quota, QuotaLimits, Scope
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """One connection's limits, named as their settings (`REACTGATE_<NAME>`)."""

    send_queue_frames: int                 # event frames queued for the socket; one more is slow_consumer
    max_conversations_per_connection: int  # watched at once; one more subscribe is overloaded
    rate_per_s: float                      # frames per second, every frame alike (ping too) ...
    rate_burst: int                        # ... with this many saved up; beyond: rate_limited
    bad_frames_before_close: int           # bad frames in a row; the last one closes with 1008


def session_limits(settings: Settings) -> SessionLimits:
    return SessionLimits(
        send_queue_frames=settings.send_queue_frames,
        max_conversations_per_connection=settings.max_conversations_per_connection,
        rate_per_s=settings.rate_per_s,
        rate_burst=settings.rate_burst,
        bad_frames_before_close=settings.bad_frames_before_close,
    )


def quota_limits(settings: Settings) -> QuotaLimits:
    """Each rule of `actors.quotas.QUOTAS` with the limit its setting holds (0: no limit). One typed
    attribute per cell: a setting renamed or gone fails mypy here, and tests/test_quotas.py checks
    that each setting moves the cell whose rule names it, and no other."""
    s = settings
    return QuotaLimits({
        (Quota.OPEN_CONVERSATIONS, Scope.USER):    s.quota_open_conversations_per_user,
        (Quota.OPEN_CONVERSATIONS, Scope.TENANT):  s.quota_open_conversations_per_tenant,
        (Quota.CONCURRENT_TURNS, Scope.USER):      s.quota_concurrent_turns_per_user,
        (Quota.CONCURRENT_TURNS, Scope.TENANT):    s.quota_concurrent_turns_per_tenant,
        (Quota.TURNS_PER_MINUTE, Scope.USER):      s.quota_turns_per_minute_per_user,
        (Quota.TURNS_PER_MINUTE, Scope.TENANT):    s.quota_turns_per_minute_per_tenant,
        (Quota.TOKENS_PER_DAY, Scope.USER):        s.quota_tokens_per_day_per_user,
        (Quota.TOKENS_PER_DAY, Scope.TENANT):      s.quota_tokens_per_day_per_tenant,
        (Quota.TOOL_CALLS_PER_TURN, Scope.TURN):   s.quota_tool_calls_per_turn,
        (Quota.CONNECTIONS, Scope.IP):             s.quota_connections_per_ip,
        (Quota.CONNECTIONS, Scope.USER):           s.quota_connections_per_user,
    })  # fmt: skip


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
