"""A store outage is a pause, not a death (docs/design.md#store-outage).

The stores map what an outage looks like to them — a lost connection, a server going away, a
failover's read-only server, a full disk, a lock held past its timeout — to `StoreUnavailable` at
their boundary (`sqlite_outage`, `postgres_outage`); everything else (SeqConflict, Tombstoned, bugs)
stays what it is. The callers that must not lose what they write (the event log's batches, a
checkpoint, a host's bookkeeping) then wait and try again, by the one rule below, until the store
answers or `store_outage_s` passed.

Sans-I/O where it can be: `RetryRule` and `Backoff` say when to try again and when to stop,
`HealthTracker` what a store saw last (its `StoreHealth`, the two log lines, the counters), and the
`*_outage` functions which errors are outages; none of them sleeps or touches a store, so they are
tested without one. `retry_unavailable` is the loop that sleeps for callers other than the event
log (whose loop also recognises its own appends), and `Prober` the task with which a store that is
down looks whether it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from actors.store.base import Store, StoreHealth, StoreStats, StoreUnavailable

log = logging.getLogger("reactgate.store")

T = TypeVar("T")

DEFAULT_STORE_OUTAGE_S: Final = 120.0
"""How long a conversation waits for its store before it is deactivated (`store_outage_s`)."""


@dataclass(frozen=True, slots=True)
class RetryRule:
    """Wait `first_s`, then `factor` times longer after each failure, never more than `max_s`."""

    first_s: float
    factor: float
    max_s: float

    def delay(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1-based)."""
        return min(self.max_s, self.first_s * self.factor ** max(0, failures - 1))


# The one table of waits (docs/design.md#store-outage). A batch waits 50 ms, 100 ms, … 2 s between
# tries: a blip costs the stream a few tens of milliseconds, a failover at most 2 s more than it
# lasts. Only the first failure and the recovery are logged, never each try.
BATCH: Final = RetryRule(first_s=0.05, factor=2.0, max_s=2.0)    # a log's batch, a checkpoint, bookkeeping
PROBE: Final = RetryRule(first_s=0.25, factor=2.0, max_s=2.0)    # a store looking whether it is back
REVIVE: Final = RetryRule(first_s=0.5, factor=2.0, max_s=5.0)    # re-activating a conversation a long outage dropped


@dataclass(slots=True)
class Backoff:
    """One caller's outage, as data: started at `started` (monotonic seconds), `failures` in a row.

    `failed` answers how long to wait before the next try, or None once `ceiling_s` passed since the
    first failure (None: no ceiling). The last wait is cut to end at the ceiling, so the last try is
    made then, and the caller gives up at the ceiling, not a whole wait later."""

    rule: RetryRule
    started: float
    ceiling_s: float | None = None
    failures: int = 0
    cause: str = ""
    delay_s: float = 0.0

    def failed(self, now: float, cause: str) -> float | None:
        self.failures += 1
        self.cause = cause
        left = None if self.ceiling_s is None else self.started + self.ceiling_s - now
        if left is not None and left <= 0:
            return None
        self.delay_s = self.rule.delay(self.failures) if left is None else min(self.rule.delay(self.failures), left)
        return self.delay_s

    @property
    def retry_after_ms(self) -> int:
        """What a caller refused meanwhile is told: the current wait, at least the rule's first."""
        return max(1, round(max(self.delay_s, self.rule.first_s) * 1000))

    def unavailable(self) -> StoreUnavailable:
        return StoreUnavailable(self.cause or "unknown cause", self.retry_after_ms)


@dataclass(slots=True)
class RetryStats:
    """What the waiting callers of this process did (`RETRY_STATS`), for a metrics collector
    (`Store.counters()`): every event log's batches, checkpoints and bookkeeping together."""

    retried_batches: int = 0      # batches that had to be tried again (counted once each)
    batch_retries: int = 0        # tries again, in all
    recognised_commits: int = 0   # a retried batch found already committed (its answer had been lost)
    logs_given_up: int = 0        # event logs that waited past store_outage_s (their conversation deactivated)
    batch_wait_seconds: float = 0.0   # how long batches waited for the store, summed over logs
    other_retries: int = 0        # tries again of other writes (a checkpoint, a list note, a quota release)


RETRY_STATS: Final = RetryStats()


async def retry_unavailable(
    call: Callable[[], Awaitable[T]], *, ceiling_s: float | None = DEFAULT_STORE_OUTAGE_S, rule: RetryRule = BATCH,
    stop: Callable[[], bool] | None = None, monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """`call()` again while it raises StoreUnavailable, by `rule`, for at most `ceiling_s` (or until
    `stop()`); then the last StoreUnavailable is raised. Anything else is raised at once. `call`
    must be safe to repeat, since a try whose answer was lost may have committed: an append is not
    (the event log has a loop of its own, which recognises its own appends), nor a quota charge."""
    backoff: Backoff | None = None
    while True:
        try:
            return await call()
        except StoreUnavailable as exc:
            now = monotonic()
            if backoff is None:
                backoff = Backoff(rule, now, ceiling_s)
            delay = backoff.failed(now, exc.cause)
            if delay is None or (stop is not None and stop()):
                raise
            RETRY_STATS.other_retries += 1
        await asyncio.sleep(delay)


async def checked_health(store: Store) -> StoreHealth:
    """A store's health after one cheap read: a store that went away is noticed even by a process
    that had nothing to write (a Ray gateway, whose hosts do the writing), so /readyz says so on
    both backends (docs/design.md#store-outage). A read that works does not end a write outage."""
    with contextlib.suppress(StoreUnavailable):
        await store.last_seq("")
    return store.health()


def counters(stats: StoreStats) -> dict[str, float]:
    """`Store.counters()`: a store's totals and this process's retries, by name."""
    found: dict[str, float] = {name: float(getattr(stats, name)) for name in StoreStats.__dataclass_fields__}
    found.pop("largest_batch", None)   # a high-water mark, not a total
    found.update({name: float(getattr(RETRY_STATS, name)) for name in RetryStats.__dataclass_fields__})
    return found


# -- what a store saw ------------------------------------------------------------------------------


OK: Final = StoreHealth(True)


class HealthTracker:
    """A store's availability as the answers of its calls show it.

    A failure starts an outage (one WARNING), a success ends it (one INFO) — except that a write
    outage (a full disk, a read-only server) is ended only by a write: reads may well go on meanwhile.
    While an outage lasts the store probes on its own (`Prober`), so it ends even when nothing else
    calls. Counts go to the store's `StoreStats`: `outages`, `unavailable` (calls refused) and
    `unavailable_seconds` (outages over, summed)."""

    def __init__(self, stats: StoreStats, *, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._stats = stats
        self._clock = clock
        self._monotonic = monotonic
        self._health = OK
        self._began = 0.0            # monotonic start of the current outage
        self._write = False          # the current outage was seen on a write
        self._calls = 0              # answers seen, and those of writes: a prober skips its look
        self._write_calls = 0        # when the store's own traffic told since its last

    def health(self) -> StoreHealth:
        return self._health

    @property
    def answers(self) -> int:
        """How many calls were answered that could end the outage now (writes, for a write outage)."""
        return self._write_calls if self._write else self._calls

    def _count(self, write: bool) -> None:
        self._calls += 1
        self._write_calls += write

    @property
    def down(self) -> bool:
        return not self._health.ok

    @property
    def write_outage(self) -> bool:
        return not self._health.ok and self._write

    def failed(self, exc: StoreUnavailable, *, write: bool, detail: str = "") -> bool:
        """A call found the store unavailable. True when this starts an outage."""
        self._count(write)
        self._stats.unavailable += 1
        if not self._health.ok:
            self._write = self._write or write
            return False
        self._health = StoreHealth(False, self._clock(), exc.cause)
        self._began = self._monotonic()
        self._write = write
        self._stats.outages += 1
        if exc.cause == DISK_FULL:
            log.warning("the disk is full: %s; the conversation waits until space is freed", detail or exc.cause)
        else:
            log.warning("store unavailable: %s%s; conversations wait and retry", exc.cause,
                        f" ({detail})" if detail else "")
        return True

    def succeeded(self, *, write: bool) -> bool:
        """A call went through. True when this ends an outage."""
        self._count(write)
        if self._health.ok or (self._write and not write):
            return False
        lasted = self._monotonic() - self._began
        self._stats.unavailable_seconds += lasted
        log.info("store available again after %.1f s (it was: %s)", lasted, self._health.cause)
        self._health = OK
        self._write = False
        return True


class Prober:
    """While its store is down, looks now and then whether it is back (`probe`, a cheap call through
    the store's own boundary, which reports to the tracker) — unless the store's traffic told since
    the last look. So a store nobody calls is not reported down forever (a replica whose /readyz
    says so would get no client to call it)."""

    def __init__(self, tracker: HealthTracker, probe: Callable[[], Awaitable[object]], rule: RetryRule = PROBE) -> None:
        self._tracker = tracker
        self._probe = probe
        self._rule = rule
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-probe")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def _run(self) -> None:
        failures, seen = 0, self._tracker.answers
        while self._tracker.down:
            failures += 1
            await asyncio.sleep(self._rule.delay(failures))
            if self._tracker.answers != seen:   # calls that could end it were answered meanwhile: they told
                seen = self._tracker.answers
                continue
            with contextlib.suppress(Exception):   # reported by the store's boundary, as any call's failure
                await self._probe()
            seen = self._tracker.answers


# -- what an outage looks like to each store ---------------------------------------------------------
# The causes are short and fixed: they reach clients (`unavailable`) and probes (/readyz).

DISK_FULL: Final = "disk full"

# SQLite's primary result codes (https://www.sqlite.org/rescode.html): the extended codes keep them
# in their low byte (SQLITE_IOERR_WRITE is 10 | 3 << 8).
_SQLITE_CAUSES: Final = {
    5: "database locked",          # SQLITE_BUSY, after busy_timeout
    6: "database locked",          # SQLITE_LOCKED
    10: "disk I/O error",          # SQLITE_IOERR
    13: DISK_FULL,                 # SQLITE_FULL: "database or disk is full"
    14: "cannot open the database file",   # SQLITE_CANTOPEN: e.g. out of file descriptors
}
_SQLITE_TEXTS: Final = (          # for an exception without its code
    ("database or disk is full", DISK_FULL),
    ("disk i/o error", "disk I/O error"),
    ("database is locked", "database locked"),
    ("database table is locked", "database locked"),
    ("unable to open database file", "cannot open the database file"),
)


def sqlite_outage(exc: BaseException) -> str | None:
    """The cause when `exc`, raised by sqlite3, means the store is unavailable for now; else None."""
    import sqlite3

    if not isinstance(exc, sqlite3.DatabaseError) or isinstance(exc, sqlite3.IntegrityError):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and (code & 0xFF) in _SQLITE_CAUSES:
        return _SQLITE_CAUSES[code & 0xFF]
    text = str(exc).lower()
    return next((cause for words, cause in _SQLITE_TEXTS if words in text), None)


# PostgreSQL's SQLSTATEs (https://www.postgresql.org/docs/current/errcodes-appendix.html) that mean
# the server cannot take the call now. Class 40 (serialization, deadlock) and a cancelled statement
# are not outages: they fail as before.
_POSTGRES_CAUSES: Final = {
    "57P01": "server shutting down",             # admin_shutdown (also pg_terminate_backend)
    "57P02": "server crashed",                   # crash_shutdown
    "57P03": "server starting up",               # cannot_connect_now
    "57P05": "connection lost",                  # idle_session_timeout
    "25006": "read-only server (failover)",      # read_only_sql_transaction
    "53100": "server disk full",                 # disk_full
    "53200": "server out of memory",             # out_of_memory
    "53300": "too many connections",             # too_many_connections
    "58030": "server I/O error",                 # io_error
}
_POSTGRES_CLASSES: Final = {
    "08": "connection lost",                     # connection exceptions
    "53": "server out of resources",             # insufficient resources
}


def postgres_outage(exc: BaseException, *, broken: bool = False) -> str | None:
    """The cause when `exc`, raised by psycopg, means the server cannot take the call now; else
    None. `broken`: the connection it came from is broken or closed (whatever the error was)."""
    import psycopg

    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(sqlstate, str):
        cause = _POSTGRES_CAUSES.get(sqlstate) or _POSTGRES_CLASSES.get(sqlstate[:2])
        if cause is not None:
            return cause
    if broken and isinstance(exc, psycopg.Error | OSError):
        return "connection lost"
    if isinstance(exc, psycopg.InterfaceError):   # e.g. "the connection is closed"
        return "connection lost"
    if isinstance(exc, psycopg.OperationalError) and sqlstate is None:   # raised by the client: no server answer
        return "cannot reach the server"
    if isinstance(exc, OSError):
        return "cannot reach the server"
    return None


def postgres_detail(exc: BaseException) -> str:
    """What a log line may say of a psycopg error: its class, its SQLSTATE, the server's own words
    (never the client's message, which may name the host and the user)."""
    parts = [type(exc).__name__]
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        parts.append(str(sqlstate))
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if primary:
        parts.append(str(primary))
    return ": ".join(parts)
