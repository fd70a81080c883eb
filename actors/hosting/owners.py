"""Ownership: who owns which conversation, and the unguessable ids conversations get.

Both backends check ownership here before any conversation is touched: a caller who does not own
a conversation gets `Forbidden`, whether or not it exists. Creating one is charged here too, for the
same reason: every `open` of both backends passes by (`open_conversations`, docs/design.md#quotas).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Container

from actors.hosting.backend import Forbidden, UnknownAgent
from actors.hosting.meter import Meter
from actors.identity import Owner
from actors.store import Store

MAX_CACHED = 100_000


def new_conversation_id() -> str:
    """Unguessable: 128 random bits (docs/wire-protocol.md#2-frames: server-generated ids)."""
    return "c_" + secrets.token_urlsafe(16)


def deletion_key(owner: Owner, request_id: str) -> str:
    """What a tombstone keeps of the delete that made it: a digest of who sent which frame id. The
    same request repeated by the same owner is recognised (`duplicate`); nothing of the owner is kept
    in the clear (docs/design.md#deletion)."""
    text = json.dumps([owner.tenant, owner.sub, request_id])
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


class Owners:
    """Who owns which conversation, read through from the store and cached."""

    def __init__(self, store: Store, meter: Meter | None = None) -> None:
        self._store = store
        self._meter = meter
        self._cache: dict[str, tuple[Owner, str]] = {}

    async def create(self, owner: Owner, agent: str, now: float) -> str:
        cid = new_conversation_id()
        if self._meter is not None:
            await self._meter.open_conversation(owner)  # QuotaExceeded: nothing created
        try:
            await self._store.create_conversation(cid, owner, agent, now)
        except BaseException:
            if self._meter is not None:
                await self._meter.conversation_gone(owner, cid)
            raise
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

    async def check_delete(self, owner: Owner, conversation_id: str, request_key: str) -> bool:
        """Before a delete: True when `owner` owns the conversation; False when this very request
        deleted it already (a repeat: `duplicate`); else Forbidden — a stranger's conversation, one
        that never existed and one another request deleted all look the same."""
        tombstone = await self._store.tombstone(conversation_id)
        if tombstone is not None:
            self.forget(conversation_id)
            if tombstone == request_key:
                return False
            raise Forbidden(conversation_id)
        await self.check(owner, conversation_id)
        return True

    def forget(self, conversation_id: str) -> None:
        """Drop a deleted conversation from the cache: from now on the store says it has no owner."""
        self._cache.pop(conversation_id, None)

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
