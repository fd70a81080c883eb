"""A conversation's event log: seq assignment, delta coalescing, write-ahead publishing
(docs/design.md#event-log).

- `seq` is assigned here, once an event is final, strictly increasing by 1 and never reused.
- Coalescing: a lane — deltas of one kind, turn and round — makes at most one event per
  `flush_interval_ms`. A delta is final at once when its lane made no event within the interval (the
  first of a lane, for time to first token, and every delta of a stream slower than the interval);
  otherwise it opens a window that ends one interval after the lane's last event, and the deltas
  until then merge into one (a timer ends the window). Any other event closes the open delta first,
  so order is preserved.
- Write-ahead rule: events go to subscribers only after `persist` returned (the store made them
  durable). No event reaches a client before it is durable (docs/design.md#write-ahead).
- A round's raw output (`attach`) is persisted with the next batch, the one holding the round's
  `round.completed`, and is never published (docs/design.md#replay).
- A log being deleted is discarded (`discard`): it keeps, persists and publishes nothing more
  (docs/design.md#deletion).
- A store outage is a pause, not a death (docs/design.md#store-outage). A batch the store refused
  with `StoreUnavailable` is tried again — the same batch, by the `BATCH` rule of
  actors/store/outage.py (50 ms doubling to 2 s) — while events emitted meanwhile queue behind it,
  in order and unpublished; `emit` goes on as ever. Once the store answers, the backlog commits in
  order and is published; seqs stay contiguous. A batch tried again that meets `SeqConflict` may
  have committed on a try whose answer was lost: the store is read back, and if it holds this very
  batch, the batch is committed (its round outputs rode with it: nothing is written twice); anything
  else there is another writer's, a real conflict. Past `store_outage_s` the log gives up: it keeps
  nothing more and tells `on_give_up`; its host deactivates the conversation, whose next
  activation recovers from the store as after a host crash (docs/design.md#recovery).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from actors.store.base import RoundOutput, SeqConflict, StoreUnavailable
from actors.store.outage import BATCH, DEFAULT_STORE_OUTAGE_S, RETRY_STATS, Backoff
from protocol.events import AnswerDelta, Event, EventData, ThinkingDelta, encode_data

log = logging.getLogger("reactgate.eventlog")

Persist = Callable[[Sequence[Event], Sequence[RoundOutput]], Awaitable[None]]
Publish = Callable[[Sequence[Event]], None]
ReadBack = Callable[[int, int], Awaitable[Sequence[Event]]]   # (after_seq, limit) → the stored events
GiveUp = Callable[[StoreUnavailable], None]
Delta = ThinkingDelta | AnswerDelta

EVENTLOG_STATS = RETRY_STATS   # retried batches, recognised commits, logs given up, wait seconds: metrics


class EventLogStopped(RuntimeError):
    """The log persists nothing more (`flush` raises it): the store refused a batch for good (a
    real conflict, a bug), or stayed unavailable past `store_outage_s`. Its `__cause__` says which."""


def same_events(stored: Sequence[Event], batch: Sequence[Event]) -> bool:
    """Whether the store holds exactly `batch`, compared as an append writes it (kind, time, data)."""
    return len(stored) == len(batch) and all(
        (a.seq, a.event, a.ts, encode_data(a.data)) == (b.seq, b.event, b.ts, encode_data(b.data))
        for a, b in zip(stored, batch, strict=True)
    )


@dataclass(slots=True)
class _OpenDelta:
    """A lane's deltas being merged into one event; `ts` is when the first of them arrived."""

    first: Delta
    ts: float
    texts: list[str] = field(default_factory=list)

    def lane(self) -> tuple[type, str, int]:
        return type(self.first), self.first.turn_id, self.first.round

    def event_data(self) -> Delta:
        return msgspec.structs.replace(self.first, text="".join(self.texts))


class EventLog:
    def __init__(
        self,
        conversation_id: str,
        *,
        last_seq: int = 0,
        flush_interval_ms: float = 25,
        persist: Persist | None = None,
        clock: Callable[[], float] = time.time,
        store_outage_s: float = DEFAULT_STORE_OUTAGE_S,
        read_back: ReadBack | None = None,
        on_give_up: GiveUp | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`persist` makes a batch durable (the store's append); `read_back(after, limit)` reads the
        store's events after a seq, which recognises a batch that committed although its append
        raised; `on_give_up` is told once the store stayed unavailable past `store_outage_s`."""
        self.conversation_id = conversation_id
        self.last_seq = last_seq              # the last seq assigned
        self.durable_seq = last_seq           # the last seq the store made durable
        self._interval = flush_interval_ms / 1000
        self._persist = persist
        self._clock = clock
        self._open: _OpenDelta | None = None
        self._lane_final: tuple[tuple[type, str, int], float] | None = None   # the last delta event: lane, when
        self._outbox: list[Event] = []
        self._outputs: list[RoundOutput] = []   # ride with the next batch; never published
        self._subscribers: list[Publish] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._discarded = False
        # store outages (docs/design.md#store-outage)
        self._outage_s = store_outage_s
        self._read_back = read_back
        self.on_give_up = on_give_up
        self._monotonic = monotonic
        self._outage: Backoff | None = None     # the batch at the store waits for it to come back
        self._gave_up = False                   # it did not, within store_outage_s
        self._stopping = asyncio.Event()        # abandon(): no other try

    # -- the store, as this log sees it ---------------------------------------------------------------

    @property
    def in_outage(self) -> bool:
        """A batch waits for the store to come back (docs/design.md#store-outage)."""
        return self._outage is not None

    @property
    def gave_up(self) -> bool:
        """The store stayed unavailable past store_outage_s: this log keeps nothing more."""
        return self._gave_up

    def unavailable(self) -> StoreUnavailable | None:
        """During an outage (or after the log gave up), what a command refused meanwhile is told:
        the cause, and when to send it again (the current wait). None while the store answers."""
        if self._outage is not None:
            return self._outage.unavailable()
        if self._gave_up and isinstance(self._failure, StoreUnavailable):
            return StoreUnavailable(self._failure.cause, self._failure.retry_after_ms)
        return None

    @property
    def _keeps_nothing(self) -> bool:
        return self._discarded or self._gave_up or self._stopping.is_set()

    # -- producing -------------------------------------------------------------------------------

    def emit(self, data: EventData) -> None:
        """Record an event; coalesces deltas of one lane. Never blocks (single writer, no awaits),
        and never fails for a store outage: the event waits behind the batch at the store. A log
        that gave up (its conversation is being deactivated) ignores it: recovery reads the store."""
        if self._keeps_nothing:
            return
        if self._failure is not None:
            raise EventLogStopped("the event log can no longer persist") from self._failure
        if isinstance(data, ThinkingDelta | AnswerDelta):
            lane = (type(data), data.turn_id, data.round)
            if self._open is not None and self._open.lane() == lane and self._interval > 0:
                self._open.texts.append(data.text)
                return
            self._close_open()
            wait = self._window_left(lane)
            if wait <= 0:
                self._final(data)  # the lane made no event within the interval: this one goes at once
                self._lane_final = (lane, self._monotonic())
                return
            self._open = _OpenDelta(data, self._clock(), [data.text])
            self._idle.clear()
            # One timer per window, not a writer wake-up: an open delta needs no write until it ends.
            asyncio.get_running_loop().call_later(wait, self._window_ended, self._open)
            return
        self._close_open()
        self._final(data)

    def _window_left(self, lane: tuple[type, str, int]) -> float:
        """How long a delta of `lane` must wait: until one interval after the lane's last event."""
        if self._interval <= 0 or self._lane_final is None or self._lane_final[0] != lane:
            return 0.0
        return self._lane_final[1] + self._interval - self._monotonic()

    def attach(self, output: RoundOutput) -> None:
        """A round's raw output, persisted in the same append as the next events: the caller emits
        the round's `round.completed` right after, so the output is durable exactly when that event
        is (docs/design.md#replay). Never published: it holds what the gates kept from the user."""
        if self._keeps_nothing:
            return
        if self._failure is not None:
            raise EventLogStopped("the event log can no longer persist") from self._failure
        self._outputs.append(output)

    def _window_ended(self, open_delta: _OpenDelta) -> None:
        if self._open is open_delta:  # else another event closed it already
            self._close_open()

    def _close_open(self) -> None:
        if self._open is not None:
            open_delta, self._open = self._open, None
            if self._failure is None and not self._keeps_nothing:
                self._final(open_delta.event_data(), open_delta.ts)
                self._lane_final = (open_delta.lane(), self._monotonic())

    def _final(self, data: EventData, ts: float | None = None) -> None:
        self.last_seq += 1
        self._outbox.append(Event.of(self.conversation_id, self.last_seq, data, ts if ts is not None else self._clock()))
        self._kick()

    def _kick(self) -> None:
        self._idle.clear()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        self._wake.set()

    # -- consuming --------------------------------------------------------------------------------

    def subscribe(self, publish: Publish) -> Callable[[], None]:
        """`publish` receives every durable event batch from now on. Returns an unsubscribe."""
        self._subscribers.append(publish)
        return lambda: self._subscribers.remove(publish) if publish in self._subscribers else None

    async def flush(self) -> None:
        """Close any open delta and wait until every event so far is durable and published — through
        a store outage, too. Raises EventLogStopped when the log stopped instead."""
        self._close_open()
        if self._outbox and self._failure is None and not self._keeps_nothing:
            self._kick()
        await self._idle.wait()
        if self._failure is not None:
            raise EventLogStopped("the event log could not persist") from self._failure

    async def discard(self) -> int:
        """Stop for good, keeping nothing more: the conversation is being deleted
        (docs/design.md#deletion). What is not durable yet is dropped, later events are ignored, and
        nothing more is published. An append already submitted may still commit — the store orders
        it before the delete, which removes it — but it is not published either. Returns the last
        seq published."""
        published = self.durable_seq  # a batch is published in the same step it becomes durable
        self._discarded = True
        self._subscribers.clear()
        self._open = None
        self._outbox.clear()
        self._outputs.clear()
        writer = self._writer
        if writer is not None and not writer.done():
            writer.cancel()
            await asyncio.wait({writer})
        self._idle.set()
        return published

    def halt(self) -> None:
        """Keep nothing more, now (the synchronous part of `abandon`): later events are ignored,
        and the batch at the store, if any, is tried no more."""
        self._stopping.set()
        self._open = None
        self._outbox.clear()
        self._outputs.clear()
        self._wake.set()

    async def abandon(self) -> None:
        """Stop without waiting for the store: the conversation leaves its host during an outage (a
        shutdown, or after the log gave up). The try under way is let finish — so that no append of
        this log is left queued at the store behind a later activation's reads — and no other is
        made. What is not durable is dropped (a batch that committed on that last try is published);
        the next activation recovers from the store, as after a crash (docs/design.md#recovery)."""
        self.halt()
        writer = self._writer
        if writer is not None and not writer.done():
            await asyncio.wait({writer})
        self._idle.set()

    async def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            await self.flush()
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer

    async def _write_loop(self) -> None:
        while True:
            if self._stopping.is_set():
                self._idle.set()
                return
            if not self._outbox:  # an open delta is closed by its window's timer, which wakes us
                if self._open is None:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._outbox = self._outbox, []
            outputs, self._outputs = self._outputs, []
            try:
                await self._persist_batch(batch, outputs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a store failure must never look like delivery
                self._failure = exc   # flush() and emit() report it; nothing after it is published
                if isinstance(exc, StoreUnavailable) and not self._stopping.is_set():
                    self._give_up(exc)
                self._idle.set()
                return
            self.durable_seq = batch[-1].seq
            for publish in list(self._subscribers):
                publish(batch)

    # -- store outages (docs/design.md#store-outage) -------------------------------------------------

    async def _persist_batch(self, batch: list[Event], outputs: list[RoundOutput]) -> None:
        """Make `batch` durable, trying again through a store outage by the BATCH rule, for at most
        store_outage_s. Raises what ends the log: StoreUnavailable past the ceiling (or once
        abandoned), any other failure at once."""
        if self._persist is None:
            return
        backoff: Backoff | None = None
        try:
            while True:
                try:
                    await self._attempt(batch, outputs, retried=backoff is not None)
                    return
                except StoreUnavailable as exc:
                    now = self._monotonic()
                    if backoff is None:
                        backoff = self._outage = Backoff(BATCH, now, self._outage_s)
                        RETRY_STATS.retried_batches += 1
                    delay = backoff.failed(now, exc.cause)
                    if delay is None or self._stopping.is_set():
                        raise
                RETRY_STATS.batch_retries += 1
                with contextlib.suppress(TimeoutError):   # abandon() ends the wait
                    await asyncio.wait_for(self._stopping.wait(), delay)
                if self._stopping.is_set():
                    raise backoff.unavailable()
        finally:
            if backoff is not None:
                RETRY_STATS.batch_wait_seconds += max(0.0, self._monotonic() - backoff.started)
                self._outage = None

    async def _attempt(self, batch: list[Event], outputs: list[RoundOutput], *, retried: bool) -> None:
        assert self._persist is not None
        try:
            await self._persist(batch, outputs)
        except SeqConflict:
            # A try again, after one whose answer was lost: that one may have committed, and taken
            # these seqs. The batch is committed if the store holds this very batch.
            if not retried or self._read_back is None:
                raise
            stored = await self._read_back(batch[0].seq - 1, len(batch))   # StoreUnavailable: try again
            if not same_events(stored, batch):
                raise                      # another writer's events: a real conflict
            RETRY_STATS.recognised_commits += 1
            log.info("conversation %s: seqs %d-%d had committed before the store's answer was lost",
                     self.conversation_id, batch[0].seq, batch[-1].seq)

    def _give_up(self, exc: StoreUnavailable) -> None:
        """Past store_outage_s: keep nothing more, and tell the host, which deactivates the
        conversation; its next activation recovers from the store (docs/design.md#recovery)."""
        self._gave_up = True
        self._open = None
        self._outbox.clear()
        self._outputs.clear()
        RETRY_STATS.logs_given_up += 1
        log.warning("conversation %s: the store stayed unavailable for %g s (%s): its log gives up after seq %d, "
                    "and the conversation recovers from the store at its next activation",
                    self.conversation_id, self._outage_s, exc.cause, self.durable_seq)
        if self.on_give_up is not None:
            try:
                self.on_give_up(exc)
            except Exception:
                log.exception("conversation %s: deactivating it after the store outage failed", self.conversation_id)
