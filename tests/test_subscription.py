"""Replay, then live, with a consumer that takes live batches directly (actors/hosting/subscription.py,
`direct`): whatever mix of batches it takes, declines, never sees published (a gap) or sees twice, what
reaches the consumer — by `direct` or through the stream, in the order it got them — is every event
once, in seq order (docs/design.md#delivery)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.hosting.subscription import Listener, replay_then_live
from actors.store.sqlite import SqliteStore
from protocol.events import ConversationDeleted, Event, ThinkingDelta

CID = "c"


def ev(seq: int) -> Event:
    return Event.of(CID, seq, ThinkingDelta(turn_id="t1", round=1, text=f"t{seq}"), ts=1700000000.0 + seq)


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = SqliteStore(":memory:")
    await s.open()
    yield s
    await s.close()


class Feed:
    """A conversation's log as a host keeps it: durable first, then published to the listener."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.head = 0
        self.listeners: list[Listener] = []

    def attach(self, listener: Listener) -> Callable[[], None]:
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener)

    async def write(self, n: int) -> list[Event]:
        batch = [ev(s) for s in range(self.head + 1, self.head + n + 1)]
        await self.store.append_events(CID, batch)
        self.head += n
        return batch

    def publish(self, batch: Sequence[Event]) -> None:
        for listener in list(self.listeners):
            listener(batch)


# One step: write n events; then publish them (or not: a gap), or twice (a repeat); let the consumer
# run 0-2 times; `direct` takes or declines what it is offered, by the flag drawn for it.
steps = st.lists(st.tuples(st.integers(1, 3), st.sampled_from(["publish", "skip", "twice"]), st.integers(0, 2)),
                 min_size=1, max_size=25)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=steps, takes=st.lists(st.booleans(), min_size=1, max_size=40),
       waits=st.lists(st.integers(0, 2), min_size=1, max_size=40), after=st.integers(0, 2))
async def test_direct_and_the_stream_together_deliver_every_event_once_in_order(
    store: SqliteStore, plan: list[tuple[int, str, int]], takes: list[bool], waits: list[int], after: int,
) -> None:
    feed = Feed(store)                               # the store is the fixture's, shared by the examples
    feed.head = await store.last_seq(CID)
    start = max(0, feed.head - after)                # a resume from somewhere in what is already there
    got: list[int] = []
    offered = iter(takes * 100)
    pauses = iter(waits * 100)
    taken = 0
    done = asyncio.Event()

    def seen(batch: list[Event]) -> None:
        got.extend(e.seq for e in batch)
        if got[-1] >= target:
            done.set()

    def direct(batch: list[Event]) -> bool:
        nonlocal taken
        if next(offered):
            seen(batch)
            taken += 1
            return True
        return False

    async def consume() -> None:
        async for batch in replay_then_live(store, CID, start, feed.attach, direct):
            for _ in range(next(pauses)):          # a consumer that waits for room, as `_offer` may
                await asyncio.sleep(0)
            seen(batch)

    target = feed.head + sum(n for n, _, _ in plan) + 1
    consumer = asyncio.create_task(consume())
    for n, how, yields in plan:
        batch = await feed.write(n)
        if how != "skip":
            feed.publish(batch)
        if how == "twice":
            feed.publish(batch)
        for _ in range(yields):
            await asyncio.sleep(0)
    feed.publish(await feed.write(1))               # the last: a gap before it is filled from the store
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        consumer.cancel()
    assert got == list(range(start + 1, target + 1))
    assert taken <= sum(1 for _, how, _ in plan if how != "skip") + 1


async def test_a_caught_up_live_batch_goes_to_direct_and_not_through_the_stream(store: SqliteStore) -> None:
    feed = Feed(store)
    direct_got: list[list[int]] = []
    stream_got: list[list[int]] = []
    arrived = asyncio.Event()

    def direct(batch: list[Event]) -> bool:
        direct_got.append([e.seq for e in batch])
        arrived.set()
        return True

    async def consume() -> None:
        async for batch in replay_then_live(store, CID, 0, feed.attach, direct):
            stream_got.append([e.seq for e in batch])
            arrived.set()

    consumer = asyncio.create_task(consume())
    feed.publish(await feed.write(1))                # before or after the stream is caught up
    await asyncio.wait_for(arrived.wait(), 10)       # once it arrived, by either way, the stream waits
    feed.publish(await feed.write(2))
    feed.publish(await feed.write(1))
    assert direct_got[-2:] == [[2, 3], [4]]          # taken as they were published: no task switch
    assert [1] in direct_got + stream_got
    feed.publish([Event.of(CID, 5, ConversationDeleted(last_seq=4), ts=0.0)])
    await asyncio.wait_for(consumer, 10)
    assert stream_got[-1] == [5]                     # the deletion's end always comes through the stream
