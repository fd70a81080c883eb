"""Ownership: who owns which conversation, and the unguessable ids conversations get.

Both backends check ownership here before any conversation is touched: a caller who does not own
a conversation gets `Forbidden`, whether or not it exists. Creating one is charged here too, for the
same reason: every `open` of both backends passes by (`open_conversations`, docs/design.md#quotas).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
from collections.abc import Container
from typing import Final

from actors.hosting.backend import Forbidden, UnknownAgent
from actors.hosting.meter import Meter
from actors.identity import Owner
from actors.store import Store

MAX_CACHED = 100_000


def new_conversation_id() -> str:
    """Unguessable: 128 random bits (docs/wire-protocol.md#2-frames: server-generated ids)."""
    return "c_" + secrets.token_urlsafe(16)


CONVERSATION_ID: Final = re.compile(r"^c_[A-Za-z0-9_-]{22}$")   # the shape of every id above and below


def chat_conversation_id(owner: Owner, chat_id: str) -> str:
    """The conversation a frontend's own chat id names (docs/frontends.md#chat-ids): the AI SDK and
    AG-UI make their ids in the browser. A digest of (owner, chat id), shaped like a server id, so two
    tenants' "chat-1" are two conversations, and nobody can take or probe an id another caller uses."""
    text = json.dumps([owner.tenant, owner.sub, chat_id])
    digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
    return "c_" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


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

    async def create(self, owner: Owner, agent: str, now: float, conversation_id: str | None = None) -> str:
        cid = conversation_id or new_conversation_id()
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
        served: Container[str], default_agent: str, now: float, create_missing: bool = False,
    ) -> tuple[str, bool]:
        """`open`'s ownership half, for both backends: (conversation id, created). No id creates a
        conversation of `agent` (UnknownAgent unless served); an id must be the caller's (Forbidden).
        `create_missing`: an id of `chat_conversation_id`, created on its first use (never a deleted one)."""
        if conversation_id is not None:
            try:
                await self.check(owner, conversation_id)
                return conversation_id, False
            except Forbidden:
                if not create_missing or await self._store.tombstone(conversation_id) is not None:
                    raise
        name = agent or default_agent
        if name not in served:
            raise UnknownAgent(name)
        try:
            return await self.create(owner, name, now, conversation_id), True
        except Exception:
            if conversation_id is None:
                raise
            await self.check(owner, conversation_id)  # a concurrent first use created it: it is the caller's
            return conversation_id, False

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
