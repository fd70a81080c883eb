"""A small in-memory Backend for the gateway's own edge tests — NOT the local backend.

It implements `actors.hosting.backend.Backend` just enough to exercise the wire protocol: ownership by
Owner, an append-only event list per conversation, replay-then-live subscriptions (live ones
wait on an asyncio.Condition), idempotent commands by (conversation_id, id), and the test hook
`emit(conversation_id, n)` that appends events as a running conversation would.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from actors.hosting.backend import (
    AckStatus,
    Answer,
    Command,
    ConfigurationReplaced,
    Forbidden,
    Opened,
    SetMode,
    Steer,
    UnknownAgent,
    UserMessage,
)
from actors.hosting.subscription import Direct
from actors.identity import Owner
from protocol.events import Event
from protocol.frames import (
    AgentEntry,
    AgentList,
    ConversationEntry,
    ConversationPage,
    decode_cursor,
    encode_cursor,
)

AGENTS = frozenset({"demo"})
BATCH = 64
REPLACED = "a newer configuration generation replaced this one"
BOOM = "boom"  # a user_message with this text makes the backend raise (tests `internal`)


@dataclass
class FakeConversation:
    owner: Owner
    agent: str
    mode: str
    events: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)


class FakeBackend:
    def __init__(self, batch: int = BATCH) -> None:
        self.generation: str | None = None
        self.on_replaced: Callable[[ConfigurationReplaced], None] | None = None
        self.conversations: dict[str, FakeConversation] = {}
        self.started = False
        self.stopped = False
        self.batch = batch
        self.subscribers = 0
        self.stream_faults = 0  # the next N stream resumptions raise, as a lost host would
        self.broken = False  # every new stream fails at once

    async def start(self) -> None:
        self.started = True

    async def quota_usage(self) -> list[Any]:
        return []  # no quotas here: the real counters are the store's (tests/test_e2e_quotas.py)

    async def stop(self) -> None:
        self.stopped = True
        for conv in self.conversations.values():
            async with conv.changed:
                conv.changed.notify_all()

    def _owned(self, owner: Owner, conversation_id: str) -> FakeConversation:
        conv = self.conversations.get(conversation_id)
        if conv is None or conv.owner != owner:
            raise Forbidden(conversation_id)
        return conv

    async def open(
        self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None
    ) -> Opened:
        if agent is not None and agent not in AGENTS:
            raise UnknownAgent(agent)
        if conversation_id is None:
            conversation_id = secrets.token_urlsafe(16)
            self.conversations[conversation_id] = FakeConversation(owner, agent or "demo", mode or "agent")
        conv = self._owned(owner, conversation_id)
        if mode is not None:
            conv.mode = mode
        return Opened(conversation_id=conversation_id, last_seq=len(conv.events))

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        conv = self._owned(owner, conversation_id)
        if isinstance(command, UserMessage | Steer | Answer):
            if command.id in conv.seen_ids:
                return "duplicate"
            conv.seen_ids.add(command.id)
        if isinstance(command, UserMessage) and command.text == BOOM:
            raise RuntimeError("secret internal detail /srv/reactgate/db.sqlite3")
        if isinstance(command, UserMessage) and command.text == REPLACED:
            # as the Ray backend does once a newer configuration generation is current
            replaced = ConfigurationReplaced(self.generation or "old", "0123abcdef", ["profile demo"])
            if self.on_replaced is not None:
                self.on_replaced(replaced)
            raise replaced
        if isinstance(command, SetMode):
            conv.mode = command.mode
        conv.commands.append(command)
        if isinstance(command, UserMessage):
            await self._append(conv, conversation_id, "turn.started", {"user_message_id": command.id})
        return "accepted"

    async def subscribe(self, owner: Owner, conversation_id: str, after_seq: int,
                        direct: Direct | None = None) -> AsyncIterator[list[Event]]:
        conv = self._owned(owner, conversation_id)
        if self.broken:
            raise ConnectionError("host lost")
        sent = after_seq
        self.subscribers += 1
        try:
            while not self.stopped:
                if len(conv.events) > sent:
                    batch = conv.events[sent : sent + self.batch]
                    sent += len(batch)
                    yield batch
                    if self.stream_faults > 0:
                        self.stream_faults -= 1
                        raise ConnectionError("host lost")
                    continue
                async with conv.changed:
                    while len(conv.events) <= sent and not self.stopped:
                        await conv.changed.wait()
        finally:
            self.subscribers -= 1

    def agents(self) -> AgentList:
        return AgentList(default="demo", agents=[AgentEntry(name=name, description="") for name in sorted(AGENTS)])

    async def list_conversations(self, owner: Owner, limit: int, before: str | None) -> ConversationPage:
        """The owner's conversations by id, descending (the real order is the store's: tests/test_store_contract.py)."""
        after = decode_cursor(before)[1] if before is not None else None
        mine = sorted((cid for cid, c in self.conversations.items() if c.owner == owner), reverse=True)
        page = [ConversationEntry(conversation_id=cid, agent=self.conversations[cid].agent, created_at=0.0,
                                  last_active_at=0.0, last_seq=len(self.conversations[cid].events), title="",
                                  running=False)
                for cid in mine if after is None or cid < after][: limit + 1]
        more = len(page) > limit
        return ConversationPage(conversations=page[:limit], next_before=encode_cursor(page[limit - 1]) if more else None)

    # -- test hooks ---------------------------------------------------------------------------

    async def emit(self, conversation_id: str, n: int, pad: int = 0) -> int:
        """Append `n` events to a conversation; returns its last seq."""
        conv = self.conversations[conversation_id]
        for _ in range(n):
            conv.events.append(self._event(conversation_id, len(conv.events) + 1, "thinking.delta",
                                           {"text": "x" * pad}))
        async with conv.changed:
            conv.changed.notify_all()
        return len(conv.events)

    async def _append(self, conv: FakeConversation, conversation_id: str, name: str, data: dict[str, Any]) -> None:
        conv.events.append(self._event(conversation_id, len(conv.events) + 1, name, data))
        async with conv.changed:
            conv.changed.notify_all()

    @staticmethod
    def _event(conversation_id: str, seq: int, name: str, data: dict[str, Any]) -> Event:
        return Event(conversation_id=conversation_id, seq=seq, event=name, data=data, ts=time.time())
