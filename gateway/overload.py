"""Load shedding: a replica that is late takes no new client (docs/design.md#overload).

The guarantee it protects is the delivery latency of what is already served. Every delivered event
costs the replica CPU; once its core is saturated, events wait (in the event loop's run queue, for
the store's writer) and each new client makes every conversation later, with none of them refused.
A replica that knows it is late says so instead: a new handshake or HTTP request is answered `503`
with `Retry-After` before any work is done for it (no token check, no WebSocket), and every
connection already open stays served. A load balancer or the client's backoff sends the work
elsewhere or later.

Two signals, each smoothed over about a second and each with hysteresis (over at its limit, clear
under half of it, so the edge does not flap); the replica is overloaded while either is over:
- the event loop's lateness: how late a timer fires. It catches a loop busy with anything, deliveries
  or not (a handshake storm, a slow endpoint).
- late live events: the share of events that reach a connection's send queue more than
  `delivery_limit_s` after they were made (the host's `Event.ts`), counting only events made after
  their subscription began (a replay's old events are not late, they are history), and only once
  enough arrive to make a share. It sees the time an event waits outside the loop (for the store's
  writer, which competes for the GIL and the core), which the timers do not. It stops at the
  queue: a client that reads slowly delays its own events, not the replica (that is a slow
  consumer, docs/wire-protocol.md#11-limits-slow-consumers-drain).

`Overload` is sans-I/O: the gateway feeds it (`GatewayServer._probe_loop` every `PROBE_S`, the
sessions per live event queued) and reads `overloaded`; the tests feed it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBE_S = 0.1          # how often the gateway measures its loop and closes a window of deliveries
SMOOTHING = 0.25       # weight of the newest probe: about the last second counts
CLEAR_SHARE = 0.5      # a signal over its limit clears under half of it (no flapping at the edge)
LATE_SHARE = 0.05      # late live events: over when 5% of them arrive later than the limit ...
MIN_EVENTS = 20.0      # ... out of at least this many per probe (smoothed: ~200 events/s)
RETRY_AFTER_S = 1      # what a refusal asks the client to wait (RFC 9110 §10.2.3, whole seconds)


@dataclass
class _Signal:
    """One smoothed measure against its limit (0: never over), with hysteresis."""

    limit: float
    value: float = 0.0
    over: bool = False

    def update(self, sample: float) -> None:
        self.value += SMOOTHING * (sample - self.value)
        if self.limit <= 0:
            return
        if self.value >= self.limit:
            self.over = True
        elif self.value < self.limit * CLEAR_SHARE:
            self.over = False


@dataclass
class Overload:
    """Whether this replica is late: its loop's smoothed lateness over `lag_limit_s`, or more than
    LATE_SHARE of its live events arriving later than `delivery_limit_s` (either limit 0: not used)."""

    lag_limit_s: float
    delivery_limit_s: float
    lag: _Signal = field(init=False)
    late: _Signal = field(init=False)
    volume: float = 0.0            # live events per probe, smoothed
    _arrived: int = 0
    _late: int = 0

    def __post_init__(self) -> None:
        self.lag = _Signal(self.lag_limit_s)
        self.late = _Signal(LATE_SHARE if self.delivery_limit_s > 0 else 0.0)

    @property
    def overloaded(self) -> bool:
        return self.lag.over or self.late.over

    def arrived(self, latency_s: float) -> None:
        """A live event reached a connection's send queue `latency_s` after it was made."""
        self._arrived += 1
        if latency_s > self.delivery_limit_s:
            self._late += 1

    def probe(self, loop_late_s: float) -> None:
        """Every PROBE_S: how late (seconds) the loop's timer fired; closes the window of live events."""
        self.lag.update(max(0.0, loop_late_s))
        self.volume += SMOOTHING * (self._arrived - self.volume)
        # Too few events to make a share are too few to be load: they count as on time.
        busy = self._arrived and self.volume >= MIN_EVENTS
        self.late.update(self._late / self._arrived if busy else 0.0)
        self._arrived = self._late = 0

    def refusal(self) -> str:
        """The text of the 503: one line, what is late, nothing else."""
        if self.lag.over:
            why = f"its event loop runs {self.lag.value * 1000:.0f} ms late"
        else:
            why = f"{self.late.value:.0%} of its events arrive later than {self.delivery_limit_s * 1000:.0f} ms"
        return f"overloaded: this replica is late ({why}); retry after {RETRY_AFTER_S} s\n"
