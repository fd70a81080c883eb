"""Provider failures in the log of the process that calls the model (docs/design.md#fallback).

A misconfigured model (a key variable that is not set, a model string with no provider) fails every
call of every conversation, and a provider that is down fails a burst of them: one line per failure
would bury the log, none would leave an operator with only the users' word. So each (model, cause)
is logged at WARNING once per window (a minute), and the next line for it says how many were left
out. The cause is `ProviderError.cause`, keys already scrubbed. The clock is injected, so the
window is tested without waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from actors.llm.errors import ProviderError

WINDOW_S: Final = 60.0
MAX_CAUSES: Final = 1024    # (model, cause) pairs remembered; a burst of distinct messages cannot grow it

log = logging.getLogger("reactgate.llm")


@dataclass(slots=True)
class _Seen:
    logged_at: float
    left_out: int = 0


class FailureLog:
    """Logs each (model, cause) once per `window_s` to `logger`, at WARNING."""

    def __init__(self, logger: logging.Logger = log, *, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, max_causes: int = MAX_CAUSES) -> None:
        self.logger = logger
        self.window_s = window_s
        self.clock = clock
        self.max_causes = max_causes
        self._seen: dict[tuple[str, str], _Seen] = {}

    def failed(self, error: ProviderError, conversation_id: str) -> bool:
        """Note one failed attempt; whether it was logged."""
        now = self.clock()
        key = (error.model, error.cause)
        seen = self._seen.get(key)
        if seen is not None and now - seen.logged_at < self.window_s:
            seen.left_out += 1
            return False
        left_out = seen.left_out if seen is not None else 0
        self._seen.pop(key, None)      # re-inserted last: the dict stays in the order of logging
        self._seen[key] = _Seen(now)
        self._forget(now)
        where = "in the middle of the response" if error.after_first_delta else "before responding"
        more = f" ({left_out} more like it in the last {self.window_s:g} s)" if left_out else ""
        self.logger.warning("model %s failed %s: %s (conversation %s)%s", error.model, where, error.cause,
                            conversation_id, more)
        return True

    def _forget(self, now: float) -> None:
        """Drop causes whose window is over, then the oldest, down to `max_causes`."""
        if len(self._seen) <= self.max_causes:
            return
        for key in [k for k, s in self._seen.items() if now - s.logged_at >= self.window_s]:
            del self._seen[key]
        while len(self._seen) > self.max_causes:
            del self._seen[next(iter(self._seen))]


# This process's log of failures: every model call goes through `stream_model`, which reports here.
FAILURES: Final = FailureLog()
