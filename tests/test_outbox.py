"""A host's outboxes, one per gateway, without Ray (docs/design.md#delivery, #generations)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from actors.ray.outbox import GATEWAY_TIMEOUT_S, POLL_GATHER_S, Outboxes, Relocated
from protocol.events import Event


class Conversations:
    """A host core's `listen`: who listens to which conversation, and `publish` to them."""

    def __init__(self) -> None:
        self.listeners: dict[str, list[Callable[[Sequence[Event]], None]]] = {}

    def listen(self, conversation_id: str, listener: Callable[[Sequence[Event]], None]) -> Callable[[], None]:
        self.listeners.setdefault(conversation_id, []).append(listener)
        return lambda: self.listeners[conversation_id].remove(listener)

    def publish(self, conversation_id: str, *seqs: int) -> list[Event]:
        batch = [Event(conversation_id=conversation_id, seq=s, event="x", data={}, ts=0.0) for s in seqs]
        for listener in list(self.listeners.get(conversation_id, ())):
            listener(batch)
        return batch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_poll_returns_everything_pending_across_the_gateways_conversations_in_order() -> None:
    convs, boxes = Conversations(), Outboxes()
    boxes.watch("gw", "a", convs.listen)
    boxes.watch("gw", "b", convs.listen)
    sent = convs.publish("a", 1, 2) + convs.publish("b", 1) + convs.publish("a", 3)
    assert await boxes.poll("gw", 1.0) == sent
    assert await boxes.poll("gw", 0.01) == []  # taken once


async def test_each_gateway_gets_its_own_copy_of_a_conversation_both_watch() -> None:
    convs, boxes = Conversations(), Outboxes()
    boxes.watch("gw1", "a", convs.listen)
    boxes.watch("gw2", "a", convs.listen)
    sent = convs.publish("a", 1)
    assert await boxes.poll("gw1", 1.0) == sent
    assert await boxes.poll("gw2", 1.0) == sent


async def test_watching_again_does_not_deliver_twice() -> None:
    convs, boxes = Conversations(), Outboxes()
    for _ in range(3):  # every re-subscribe of the gateway watches again
        boxes.watch("gw", "a", convs.listen)
    assert len(convs.listeners["a"]) == 1
    sent = convs.publish("a", 1)
    assert await boxes.poll("gw", 1.0) == sent


async def test_a_waiting_poll_answers_as_soon_as_something_is_delivered() -> None:
    convs, boxes = Conversations(), Outboxes()
    boxes.watch("gw", "a", convs.listen)
    poll = asyncio.create_task(boxes.poll("gw", 30.0))
    await asyncio.sleep(0.01)
    assert not poll.done()
    sent = convs.publish("a", 1)
    assert await asyncio.wait_for(poll, 1.0) == sent


async def test_an_empty_poll_ends_at_its_timeout() -> None:
    boxes = Outboxes()
    assert await asyncio.wait_for(boxes.poll("unknown", 0.01), 1.0) == []


async def test_polls_are_answered_at_most_once_per_gather_interval() -> None:
    # Under load the events of many conversations gather into one Ray call (docs/design.md#delivery).
    clock = Clock()
    convs, boxes = Conversations(), Outboxes(clock=clock)
    boxes.watch("gw", "a", convs.listen)
    convs.publish("a", 1)
    await boxes.poll("gw", 1.0)
    convs.publish("a", 2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await boxes.poll("gw", 1.0)  # the clock did not move: this answer waits out the interval
    assert loop.time() - started >= POLL_GATHER_S * 0.9


async def test_unwatch_stops_delivery_and_releases_the_listener() -> None:
    convs, boxes = Conversations(), Outboxes()
    boxes.watch("gw", "a", convs.listen)
    boxes.unwatch("gw", "a")
    boxes.unwatch("gw", "a")       # twice, or for a pair never watched: nothing
    boxes.unwatch("other", "a")
    assert convs.listeners["a"] == []
    convs.publish("a", 1)
    assert await boxes.poll("gw", 0.01) == []


async def test_a_relocated_conversation_is_announced_after_what_came_before_and_not_delivered_again() -> None:
    convs, boxes = Conversations(), Outboxes()
    boxes.watch("gw1", "a", convs.listen)
    boxes.watch("gw2", "a", convs.listen)
    boxes.watch("gw1", "b", convs.listen)
    sent = convs.publish("a", 1)
    boxes.relocated("a")
    convs.publish("a", 2)          # nothing reaches a gateway from this host any more
    assert await boxes.poll("gw1", 1.0) == [*sent, Relocated("a")]
    assert await boxes.poll("gw2", 1.0) == [*sent, Relocated("a")]
    assert convs.listeners["a"] == []
    assert len(convs.listeners["b"]) == 1


async def test_relocation_of_an_unwatched_conversation_tells_nobody() -> None:
    convs, boxes = Conversations(), Outboxes()
    boxes.watch("gw", "a", convs.listen)
    boxes.relocated("b")
    assert await boxes.poll("gw", 0.01) == []


async def test_a_gateway_silent_for_the_timeout_is_forgotten_with_its_watches() -> None:
    clock = Clock()
    convs, boxes = Conversations(), Outboxes(clock=clock)
    boxes.watch("gone", "a", convs.listen)
    boxes.watch("alive", "a", convs.listen)
    clock.now += GATEWAY_TIMEOUT_S / 2
    await boxes.poll("alive", 0.0)
    clock.now += GATEWAY_TIMEOUT_S / 2 + 1
    assert boxes.forget_silent() == ["gone"]
    assert len(convs.listeners["a"]) == 1           # the live gateway's listener only
    sent = convs.publish("a", 1)
    assert await boxes.poll("alive", 1.0) == sent
    assert boxes.forget_silent() == []


async def test_a_gateway_that_watched_but_never_polled_is_timed_from_its_first_watch() -> None:
    clock = Clock()
    convs, boxes = Conversations(), Outboxes(clock=clock)
    boxes.watch("gw", "a", convs.listen)
    clock.now += GATEWAY_TIMEOUT_S - 1
    boxes.watch("gw", "b", convs.listen)            # watching is not polling
    assert boxes.forget_silent() == []
    clock.now += 2
    assert boxes.forget_silent() == ["gw"]
    assert convs.listeners == {"a": [], "b": []}
