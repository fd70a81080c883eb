"""Replay, then live: one subscription's event stream with no gap and no duplicate
(docs/design.md#delivery).

The store is the truth; live batches are a fast path. Every event is durable before it is
published, so a gap between what was sent and a live batch is always filled from the store, and
anything at or below the last sent seq is dropped. A listener that falls behind loses nothing: its
queue is dropped and the stream refills from the store.

A deletion ends the stream (docs/design.md#deletion): the host publishes `conversation.deleted` as
the conversation's last batch; the subscription sends it as its next seq and stops. The store has
nothing left to fill a gap with, so that event is never dropped, not even by an overflow.

Consumer-side code: both backends' `subscribe` run it in the gateway process, each with its own way
to attach a listener (the local host core directly; the Ray backend through its per-host link).

`direct`, when the consumer gives one, takes live batches as they are published, with no hop through
the stream: only while the stream waits on an empty queue, caught up, and only a batch that follows on
from the last seq with no gap. Anything else — a gap, a duplicate, a batch `direct` declines (no room),
the deletion's end — takes the stream as before, so the order is the stream's and nothing is lost or
repeated either way. It saves a task switch and an async-generator step per live batch
(bench/README.md, "Toward 1,000 conversations per core").
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeGuard

import msgspec

from actors.store import Store
from protocol.events import ConversationDeleted, Event

Listener = Callable[[Sequence[Event]], None]
Direct = Callable[[list[Event]], bool]   # takes a live batch in order now (True), or declines it
Detach = Callable[[], None]
Attach = Callable[[Listener], Detach | Awaitable[Detach]]

PAGE = 500
MAX_QUEUED_BATCHES = 1000


async def replay_then_live(
    store: Store, conversation_id: str, after_seq: int, attach: Attach, direct: Direct | None = None
) -> AsyncIterator[list[Event]]:
    queue: asyncio.Queue[Sequence[Event] | None] = asyncio.Queue()
    overflowed = False
    last = after_seq
    parked = False   # the stream waits on its empty queue: a live batch may go to `direct`

    def on_batch(batch: Sequence[Event]) -> None:
        nonlocal overflowed, last
        if parked and direct is not None and batch and queue.empty() and not ends(batch):
            fresh = [e for e in batch if e.seq > last]
            if not fresh:
                return
            if fresh[0].seq == last + 1 and direct(fresh):
                last = fresh[-1].seq
                return
        # Overflow: the store has it all, so refill from there; but never drop the end of a deleted log.
        if queue.qsize() >= MAX_QUEUED_BATCHES and not ends(batch):
            overflowed = True
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)
            return
        queue.put_nowait(batch)

    attached = attach(on_batch)  # attach first, then read: nothing published in between is missed
    detach: Detach = await attached if inspect.isawaitable(attached) else attached  # type: ignore[assignment]
    try:
        while True:
            page = await store.read_events(conversation_id, last, limit=PAGE)
            if page:
                last = page[-1].seq
                yield page
            if len(page) < PAGE:
                break
        while True:
            parked = True
            try:
                batch = await queue.get()
            finally:
                parked = False
            if ends(batch):
                yield deleted(batch, last)
                return
            if not batch or overflowed:  # None: overflow; []: a hint to look in the store (host failover)
                overflowed = False
                async for page in _read_from(store, conversation_id, last):
                    last = page[-1].seq
                    yield page
                continue
            fresh = [e for e in batch if e.seq > last]
            if not fresh:
                continue
            if fresh[0].seq > last + 1:  # published before we attached, or reordered: fill the gap
                async for page in _read_from(store, conversation_id, last, until=fresh[0].seq - 1):
                    last = page[-1].seq
                    yield page
                fresh = [e for e in fresh if e.seq > last]
                if not fresh:
                    continue
            last = fresh[-1].seq
            yield fresh
    finally:
        detach()


def ends(batch: Sequence[Event] | None) -> TypeGuard[Sequence[Event]]:
    """The conversation's last batch: it was deleted."""
    return batch is not None and len(batch) > 0 and isinstance(batch[-1].data, ConversationDeleted)


def deleted(batch: Sequence[Event], last: int) -> list[Event]:
    """The end of a subscription that sent up to `last`: the events of the batch that follow on from
    it (the log they would be read from is gone, so a gap ends what can be sent), then
    `conversation.deleted` as the next seq."""
    out: list[Event] = []
    for event in batch[:-1]:
        if event.seq == last + 1:
            out.append(event)
            last = event.seq
    return [*out, msgspec.structs.replace(batch[-1], seq=last + 1)]


async def _read_from(
    store: Store, conversation_id: str, after_seq: int, until: int | None = None
) -> AsyncIterator[list[Event]]:
    last = after_seq
    while until is None or last < until:
        limit = PAGE if until is None else min(PAGE, until - last)
        page = await store.read_events(conversation_id, last, limit=limit)
        if not page:
            return
        last = page[-1].seq
        yield page
