"""Replay, then live: one subscription's event stream with no gap and no duplicate
(docs/design.md#delivery).

The store is the truth; live batches are a fast path. Every event is durable before it is
published, so a gap between what was sent and a live batch is always filled from the store, and
anything at or below the last sent seq is dropped. A listener that falls behind loses nothing: its
queue is dropped and the stream refills from the store.

Consumer-side code: both backends' `subscribe` run it in the gateway process, each with its own way
to attach a listener (the local host core directly; the Ray backend through its per-host link).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from actors.store import Store
from protocol.events import Event

Listener = Callable[[Sequence[Event]], None]
Detach = Callable[[], None]
Attach = Callable[[Listener], Detach | Awaitable[Detach]]

PAGE = 500
MAX_QUEUED_BATCHES = 1000


async def replay_then_live(
    store: Store, conversation_id: str, after_seq: int, attach: Attach
) -> AsyncIterator[list[Event]]:
    queue: asyncio.Queue[Sequence[Event] | None] = asyncio.Queue()
    overflowed = False

    def on_batch(batch: Sequence[Event]) -> None:
        nonlocal overflowed
        if queue.qsize() >= MAX_QUEUED_BATCHES:  # the store has it all: refill from there
            overflowed = True
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)
            return
        queue.put_nowait(batch)

    attached = attach(on_batch)  # attach first, then read: nothing published in between is missed
    detach: Detach = await attached if inspect.isawaitable(attached) else attached  # type: ignore[assignment]
    last = after_seq
    try:
        while True:
            page = await store.read_events(conversation_id, last, limit=PAGE)
            if page:
                last = page[-1].seq
                yield page
            if len(page) < PAGE:
                break
        while True:
            batch = await queue.get()
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
