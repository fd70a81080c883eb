"""The `local` backend: conversations hosted in-process by one `HostCore` (docs/design.md#hosting).

Same conversation logic as the Ray backend — only the hosting shell differs. Ownership is
checked first (`Owners`), before any conversation is touched: a caller who does not own a
conversation gets `Forbidden`, whether or not it exists.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping

from actors.conversation import Runtime
from actors.external_call import Access, ExternalCall, ExternalReply, ExternalView
from actors.hosting.backend import AckStatus, Command, ConfigurationReplaced, Export, Opened, SetMode
from actors.hosting.export import export_log
from actors.hosting.host import HostCore
from actors.hosting.listing import agent_list, conversation_page
from actors.hosting.owners import Owners, deletion_key
from actors.hosting.subscription import Direct, replay_then_live
from actors.identity import Owner
from actors.llm.stream import warm_up
from actors.profile import AgentProfile
from actors.quotas import TenantUsage
from actors.store import Store, StoreHealth
from actors.store.outage import DEFAULT_STORE_OUTAGE_S, checked_health
from protocol.events import Event, ExternalClient
from protocol.frames import AgentList, ConversationPage, Mode


class LocalBackend:
    def __init__(
        self,
        store: Store,
        runtime: Runtime,
        profiles: Mapping[str, AgentProfile],
        *,
        default_agent: str,
        idle_ttl_s: float = 600,
        store_outage_s: float = DEFAULT_STORE_OUTAGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.generation: str | None = None  # nothing here outlives the process
        self.on_replaced: Callable[[ConfigurationReplaced], None] | None = None  # never replaced
        self.store = store
        self.profiles = profiles
        self.default_agent = default_agent
        self.clock = clock
        self.host = HostCore(store, runtime, profiles, idle_ttl_s=idle_ttl_s, clock=clock, quotas=runtime.quotas,
                             store_outage_s=store_outage_s)
        self.owners = Owners(store, self.host.meter)

    async def store_health(self) -> StoreHealth:
        """The store as this process sees it, for /readyz and /metrics (docs/design.md#store-outage)."""
        return await checked_health(self.store)

    def store_counters(self) -> dict[str, float]:
        return self.store.counters()

    async def start(self) -> None:
        await self.store.open()
        await warm_up()
        self.host.start()

    async def stop(self) -> None:
        await self.host.close()
        await self.store.close()
        if "actors.tools.mcp" in sys.modules:  # tools ran here: stop the MCP servers they started
            await sys.modules["actors.tools.mcp"].close_sessions()
        if "actors.llm.transport" in sys.modules:   # models were read here: close the pooled HTTP session
            await sys.modules["actors.llm.transport"].aclose_sessions()

    async def open(
        self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None,
        create_missing: bool = False,
    ) -> Opened:
        conversation_id, created = await self.owners.open(
            owner, conversation_id, agent, served=self.profiles, default_agent=self.default_agent, now=self.clock(),
            create_missing=create_missing,
        )
        if not created:
            # Re-opening (and subscribing: the gateway opens first) re-activates the conversation, so
            # a turn cut by a crash or a drain resumes from the store now, not at the next command
            # (docs/design.md#passivation, docs/design.md#recovery).
            await self.host.activate(conversation_id)
        if mode is not None:
            await self.host.command(conversation_id, SetMode(id=f"open-{uuid.uuid4().hex}", mode=Mode(mode)))
        return Opened(conversation_id, await self.store.last_seq(conversation_id))

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        await self.owners.check(owner, conversation_id)
        return await self.host.command(conversation_id, command)  # type: ignore[return-value]

    async def subscribe(self, owner: Owner, conversation_id: str, after_seq: int,
                        direct: Direct | None = None) -> AsyncIterator[list[Event]]:
        await self.owners.check(owner, conversation_id)
        async for batch in replay_then_live(
            self.store, conversation_id, after_seq, lambda listener: self.host.listen(conversation_id, listener), direct
        ):
            yield batch

    async def delete(self, owner: Owner, conversation_id: str, request_id: str) -> AckStatus:
        key = deletion_key(owner, request_id)
        if not await self.owners.check_delete(owner, conversation_id, key):
            return "duplicate"
        try:
            return await self.host.delete(conversation_id, key)  # type: ignore[return-value]
        finally:
            self.owners.forget(conversation_id)

    async def export(self, owner: Owner, conversation_id: str, request_id: str) -> Export:
        await self.owners.check(owner, conversation_id)
        return await export_log(self.store, conversation_id, request_id, self.clock())

    async def quota_usage(self) -> list[TenantUsage]:
        return await self.host.meter.tenant_usage()

    def agents(self) -> AgentList:
        return agent_list(self.profiles, self.default_agent)

    async def list_conversations(self, owner: Owner, limit: int, before: str | None) -> ConversationPage:
        return await conversation_page(self.store, owner, limit, before)

    # -- the MCP face's calls (docs/design.md#mcp-face) ----------------------------------------------

    async def external_call(self, owner: Owner, conversation_id: str, call: ExternalCall) -> ExternalReply:
        await self.owners.check(owner, conversation_id)
        return await self.host.external(conversation_id, call)

    async def external_view(self, owner: Owner, conversation_id: str, session_id: str, client: ExternalClient,
                            access: Access | None) -> ExternalView:
        await self.owners.check(owner, conversation_id)
        return await self.host.external_view(conversation_id, session_id, client, access)

    async def external_cancel(self, owner: Owner, conversation_id: str, call_id: str) -> bool:
        await self.owners.check(owner, conversation_id)
        return await self.host.external_cancel(conversation_id, call_id)
