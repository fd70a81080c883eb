"""A ConversationHost's outboxes: one per gateway, drained by that gateway's long poll
(docs/design.md#delivery).

Why one outbox per gateway and not one stream per conversation: one Ray stream carried about 3,300
items/s on 2 cores, far less than a busy host produces, so a gateway's pump takes everything pending
for it across its conversations in one call — one Ray call per batch, never one per delta. Under
load a poll returns hundreds of events.

Plain asyncio, no Ray: the ConversationHost actor (`actors/ray/host.py`) calls it from its one
event loop, and tests construct it with a fake `listen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from protocol.events import ConversationDeleted, Event

GATEWAY_TIMEOUT_S = 60.0     # a gateway that has not polled for this long is presumed gone
POLL_GATHER_S = 0.005        # a gateway's polls are answered at most this often (events batch up)

# `HostCore.listen`: start delivering a conversation's published batches; returns the unsubscribe.
Listen = Callable[[str, Callable[[Sequence[Event]], None]], Callable[[], None]]


@dataclass(frozen=True)
class Relocated:
    """In a gateway's poll batch, among the events: this host passivated the conversation while
    draining, and will not publish its events again. Watch it wherever it activates next
    (docs/design.md#generations)."""

    conversation_id: str


@dataclass
class _Outbox:
    last_poll: float
    pending: list[Event | Relocated] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    watches: dict[str, Callable[[], None]] = field(default_factory=dict)  # conversation → unsubscribe

    def deliver(self, batch: Sequence[Event | Relocated]) -> None:
        self.pending.extend(batch)
        self.wakeup.set()


class Outboxes:
    """What each gateway watches on this host, and what waits for its next poll."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._boxes: dict[str, _Outbox] = {}
        self._clock = clock

    def _box(self, gateway_id: str) -> _Outbox:
        box = self._boxes.get(gateway_id)
        if box is None:
            box = self._boxes[gateway_id] = _Outbox(last_poll=self._clock())
        return box

    def watch(self, gateway_id: str, conversation_id: str, listen: Listen) -> None:
        """Deliver the conversation's published batches to this gateway's outbox; once per pair,
        however often the gateway watches (every re-subscribe does). A deleted conversation's watch
        ends with its `conversation.deleted`: nothing is published after it, and the gateway may
        never unwatch it (bench/soak.py found one watch left per deleted conversation)."""
        box = self._box(gateway_id)
        if conversation_id in box.watches:
            return
        ended = False

        def deliver(batch: Sequence[Event]) -> None:
            nonlocal ended
            box.deliver(batch)
            if batch and isinstance(batch[-1].data, ConversationDeleted):
                ended = True
                unsubscribe = box.watches.pop(conversation_id, None)
                if unsubscribe is not None:
                    unsubscribe()

        unsubscribe = listen(conversation_id, deliver)
        if ended:  # deleted before: `listen` delivered its end at once
            unsubscribe()
        else:
            box.watches[conversation_id] = unsubscribe

    def unwatch(self, gateway_id: str, conversation_id: str) -> None:
        box = self._boxes.get(gateway_id)
        unsubscribe = box.watches.pop(conversation_id, None) if box is not None else None
        if unsubscribe is not None:
            unsubscribe()

    def relocated(self, conversation_id: str) -> None:
        """This draining host passivated the conversation: each gateway watching it stops getting
        its events from here, and is told so in its next batch, after whatever came before."""
        for box in self._boxes.values():
            unsubscribe = box.watches.pop(conversation_id, None)
            if unsubscribe is not None:
                unsubscribe()
                box.deliver([Relocated(conversation_id)])

    async def poll(self, gateway_id: str, timeout_s: float) -> list[Event | Relocated]:
        """Everything pending for the gateway, once there is something or `timeout_s` passed."""
        known = self._boxes.get(gateway_id)
        previous = known.last_poll if known is not None else 0.0
        box = self._box(gateway_id)
        box.last_poll = self._clock()
        if not box.pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(box.wakeup.wait(), timeout_s)
        # At most one answer per POLL_GATHER_S: under load the events of many conversations gather
        # into one Ray call instead of one call per event or two (bench/README.md, `load_300.py`).
        gather = previous + POLL_GATHER_S - self._clock()
        if gather > 0:
            await asyncio.sleep(gather)
        box.wakeup.clear()
        batch, box.pending = box.pending, []
        return batch

    def forget_silent(self) -> list[str]:
        """Drop the gateways that have not polled for GATEWAY_TIMEOUT_S (counted from their first
        watch if they never polled), with their watches: a gateway that went away must not keep
        its listeners on this host's conversations."""
        now = self._clock()
        silent = [g for g, box in self._boxes.items() if now - box.last_poll > GATEWAY_TIMEOUT_S]
        for gateway_id in silent:
            for unsubscribe in self._boxes.pop(gateway_id).watches.values():
                unsubscribe()
        return silent
