"""A conversation's event log: seq assignment, delta coalescing, write-ahead publishing
(docs/design.md#event-log).

- `seq` is assigned here, once an event is final, strictly increasing by 1 and never reused.
- Coalescing: the first delta of a lane is final at once (time to first token); later deltas of
  the same lane — same kind, turn and round — merge for `flush_interval_ms` from the first of
  them (a timer ends the window). Any other event closes the open delta first, so order is
  preserved.
- Write-ahead rule: events go to subscribers only after `persist` returned (the store made them
  durable). No event reaches a client before it is durable (docs/design.md#write-ahead).
- A round's raw output (`attach`) is persisted with the next batch, the one holding the round's
  `round.completed`, and is never published (docs/design.md#replay).
- A log being deleted is discarded (`discard`): it keeps, persists and publishes nothing more
  (docs/design.md#deletion).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from actors.store.base import RoundOutput
from protocol.events import AnswerDelta, Event, EventData, ThinkingDelta

Persist = Callable[[Sequence[Event], Sequence[RoundOutput]], Awaitable[None]]
Publish = Callable[[Sequence[Event]], None]
Delta = ThinkingDelta | AnswerDelta


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
    ) -> None:
        self.conversation_id = conversation_id
        self.last_seq = last_seq              # the last seq assigned
        self.durable_seq = last_seq           # the last seq the store made durable
        self._interval = flush_interval_ms / 1000
        self._persist = persist
        self._clock = clock
        self._open: _OpenDelta | None = None
        self._lanes_seen: set[tuple[type, str, int]] = set()
        self._outbox: list[Event] = []
        self._outputs: list[RoundOutput] = []   # ride with the next batch; never published
        self._subscribers: list[Publish] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._discarded = False

    # -- producing -------------------------------------------------------------------------------

    def emit(self, data: EventData) -> None:
        """Record an event; coalesces deltas of one lane. Never blocks (single writer, no awaits)."""
        if self._discarded:
            return
        if self._failure is not None:
            raise RuntimeError("the event log can no longer persist") from self._failure
        if isinstance(data, ThinkingDelta | AnswerDelta):
            lane = (type(data), data.turn_id, data.round)
            if self._open is not None and self._open.lane() == lane and self._interval > 0:
                self._open.texts.append(data.text)
                return
            self._close_open()
            if lane not in self._lanes_seen or self._interval <= 0:
                self._lanes_seen.add(lane)
                self._final(data)  # the first delta of a lane goes at once
                return
            self._open = _OpenDelta(data, self._clock(), [data.text])
            self._idle.clear()
            # One timer per window, not a writer wake-up: an open delta needs no write until it ends.
            asyncio.get_running_loop().call_later(self._interval, self._window_ended, self._open)
            return
        self._close_open()
        self._final(data)

    def attach(self, output: RoundOutput) -> None:
        """A round's raw output, persisted in the same append as the next events: the caller emits
        the round's `round.completed` right after, so the output is durable exactly when that event
        is (docs/design.md#replay). Never published: it holds what the gates kept from the user."""
        if self._discarded:
            return
        if self._failure is not None:
            raise RuntimeError("the event log can no longer persist") from self._failure
        self._outputs.append(output)

    def _window_ended(self, open_delta: _OpenDelta) -> None:
        if self._open is open_delta:  # else another event closed it already
            self._close_open()

    def _close_open(self) -> None:
        if self._open is not None:
            open_delta, self._open = self._open, None
            self._final(open_delta.event_data(), open_delta.ts)

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
        """Close any open delta and wait until every event so far is durable and published."""
        self._close_open()
        if self._outbox:
            self._kick()
        await self._idle.wait()
        if self._failure is not None:
            raise RuntimeError("the event log could not persist") from self._failure

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

    async def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            await self.flush()
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer

    async def _write_loop(self) -> None:
        while True:
            if not self._outbox:  # an open delta is closed by its window's timer, which wakes us
                if self._open is None:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._outbox = self._outbox, []
            outputs, self._outputs = self._outputs, []
            try:
                if self._persist is not None:
                    await self._persist(batch, outputs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a store failure must never look like delivery
                self._failure = exc   # flush() and emit() report it; nothing after it is published
                self._idle.set()
                return
            self.durable_seq = batch[-1].seq
            for publish in list(self._subscribers):
                publish(batch)
