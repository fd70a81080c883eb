"""The garbage collector of a serving process (the gateway, a Ray ConversationHost).

Two settings, taken once the process has loaded what it keeps (LiteLLM, the agents, the backend):
- `gc.freeze()`: what is loaded by then lives as long as the process; out of the collector's sight, a
  full collection no longer walks it on the event loop (it stalled every stream for 200–330 ms, about
  once a second, at 300 conversations: bench/README.md, `load_300.py`).
- `gc.set_threshold(*THRESHOLDS)`: a young collection every 50,000 net allocations instead of 700.
  Per delivered event the path allocates a few hundred short-lived objects (deltas, events, frames,
  futures); at 700, collections walked them about every other event, 7% of the server's CPU
  (`perf`: bench/profiles/peer-bench-local-100-perf.txt). Refcounting frees nearly all of them first; the
  collector still finds every cycle, later.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 100)


def settle() -> None:
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
