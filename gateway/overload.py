"""Load shedding: a replica whose event loop runs late takes no new client (docs/design.md#overload).

The guarantee it protects is the latency of what is already served. Every delivered event costs the
gateway's one event loop some CPU; once the loop is saturated, every callback waits in its run queue,
and each new client makes every conversation later, with none of them refused. A replica that knows
it is late says so instead: while its loop runs late, a new handshake or HTTP request is answered
`503` with `Retry-After` before any work is done for it (no token check, no WebSocket), and every
connection already open stays served. A load balancer or the client's backoff sends the work
elsewhere or later.

`LoopLag` is sans-I/O: the gateway (`GatewayServer._watch_lag`) measures how late a timer of its
loop fires, every `PROBE_S`, and feeds it in; the tests feed it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

PROBE_S = 0.1          # how often the gateway measures its loop
SMOOTHING = 0.25       # weight of the newest probe: the lag of about the last second counts
CLEAR_SHARE = 0.5      # overloaded until the lag falls under half the limit (no flapping at the edge)
RETRY_AFTER_S = 1      # what a refusal asks the client to wait (RFC 9110 §10.2.3, whole seconds)


@dataclass
class LoopLag:
    """The smoothed lateness of the loop's timers and whether it is over `limit_s` (0: never)."""

    limit_s: float
    lag_s: float = 0.0
    overloaded: bool = False

    def observe(self, late_s: float) -> None:
        """One probe: how late (seconds) a timer fired after the time it was due."""
        self.lag_s += SMOOTHING * (max(0.0, late_s) - self.lag_s)
        if self.limit_s <= 0:
            return
        if self.lag_s >= self.limit_s:
            self.overloaded = True
        elif self.lag_s < self.limit_s * CLEAR_SHARE:
            self.overloaded = False

    def refusal(self) -> str:
        """The text of the 503 (one line, no detail an attacker could use beyond the load)."""
        return (f"overloaded: this replica's event loop runs {self.lag_s * 1000:.0f} ms late; "
                f"retry after {RETRY_AFTER_S} s\n")
