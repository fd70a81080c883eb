"""Ownership: who owns which conversation, and the unguessable ids conversations get.

Both backends check ownership here before any conversation is touched: a caller who does not own
a conversation gets `Forbidden`, whether or not it exists.
"""

from __future__ import annotations

import secrets
from collections.abc import Container

from actors.hosting.backend import Forbidden, Owner, UnknownAgent
from actors.store import Store

MAX_CACHED = 100_000


def new_conversation_id() -> str:
    """Unguessable: 128 random bits (docs/wire-protocol.md#2-frames: server-generated ids)."""
    return "c_" + secrets.token_urlsafe(16)


class Owners:
    """Who owns which conversation, read through from the store and cached."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cache: dict[str, tuple[Owner, str]] = {}

    async def create(self, owner: Owner, agent: str, now: float) -> str:
        cid = new_conversation_id()
        await self._store.create_conversation(cid, owner, agent, now)
        self._cache[cid] = (owner, agent)
        return cid

    async def open(
        self, owner: Owner, conversation_id: str | None, agent: str | None, *,
        served: Container[str], default_agent: str, now: float,
    ) -> tuple[str, bool]:
        """`open`'s ownership half, for both backends: (conversation id, created). No id creates a
        conversation of `agent` (UnknownAgent unless served); an id must be the caller's (Forbidden)."""
        if conversation_id is not None:
            await self.check(owner, conversation_id)
            return conversation_id, False
        name = agent or default_agent
        if name not in served:
            raise UnknownAgent(name)
        return await self.create(owner, name, now), True

    async def agent_of(self, conversation_id: str) -> str | None:
        found = self._cache.get(conversation_id) or await self._store.conversation_owner(conversation_id)
        return found[1] if found is not None else None

    async def check(self, owner: Owner, conversation_id: str) -> str:
        """The conversation's agent, if `owner` owns it; else Forbidden (exists or not)."""
        found = self._cache.get(conversation_id)
        if found is None:
            found = await self._store.conversation_owner(conversation_id)
            if found is not None:
                if len(self._cache) > MAX_CACHED:
                    self._cache.clear()
                self._cache[conversation_id] = found
        if found is None or found[0] != owner:
            raise Forbidden(conversation_id)
        return found[1]
