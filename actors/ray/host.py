"""The ConversationHost actor: a shell around `HostCore` (docs/design.md#hosting).

What the shell adds is what only Ray has: a named process every gateway finds, the claim of each
activation at the Directory (docs/design.md#placement), delivery to each gateway in batches —
one outbox per gateway (`actors/ray/outbox.py`), drained by that gateway's long poll
(docs/design.md#delivery) — and its part in host death (docs/design.md#host-death): a lifeline
the Directory holds, and the adoption of a dead host's conversations that had a turn in flight.
And its part in generations (docs/design.md#generations): a host serves one configuration
generation; once a newer one is current it drains — passivates each conversation when no turn
runs there, tells the gateways watching it to watch it on its new host (`Relocated`), and is
retired once it holds nothing.
Everything it needs arrives in its `RayConfig`: the store URL, the profiles, the scripts, the tool
registry; it reads nothing from its process environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import ray

from actors import heap, tracing
from actors.conversation import Runtime
from actors.external_call import Access, ExternalCall, ExternalReply, ExternalView
from actors.hosting.backend import Command, ConfigurationReplaced
from actors.hosting.host import HostCore
from actors.llm.scripts import register_script
from actors.llm.stream import stream_model, warm_up
from actors.ray.config import RayConfig
from actors.ray.names import DIRECTORY_NAME, NAMESPACE, is_dedicated, placement, tool_pool
from actors.ray.outbox import Outboxes, Relocated
from actors.ray.singletons import get_or_create
from actors.ray.tool_pool import ToolPoolActor, ToolPoolClient
from actors.store import store_from_url
from protocol.events import Event, ExternalClient

log = logging.getLogger("reactgate.ray.host")

HEARTBEAT_S = 5.0            # re-registration: a restarted Directory starts empty
ADOPT_CONCURRENCY = 16       # activations at once when adopting a dead host's conversations
DRAIN_CHECK_S = 0.2          # a draining host passivates a conversation this soon after its turn ends


class WrongHost(Exception):
    """Another live host holds this conversation's activation; route there."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


# A Ray worker process has no logging configured: a host's lines (a model's failures,
# actors/llm/failures.py) would reach its stderr — a worker log file, forwarded to the driver —
# bare, and INFO not at all. The gateway's own format (gateway/cli.py), in every host process.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def register_scripts(config: RayConfig) -> None:
    """The scripted model's registry is per process: every host registers the cluster's scripts."""
    for name, path in config.scripts.items():
        register_script(name, Path(path))


@ray.remote(max_restarts=0, max_concurrency=1000)  # type: ignore[call-overload]  # stubs lack actor options
class ConversationHost:
    """Hosts many conversations (a HostCore); delivers their events to each gateway in batches."""

    def __init__(self, name: str, config: RayConfig) -> None:
        configure_logging()
        self.name = name
        self.incarnation = uuid.uuid4().hex
        self.config = config
        tracing.configure(config.otlp_endpoint, service="reactgate-host")  # none: no exporter, no cost
        self.generation = config.generation
        self._draining = False
        self._drainer: asyncio.Task[None] | None = None
        self._core: HostCore | None = None
        self._starting: asyncio.Lock | None = None
        self._outboxes = Outboxes()
        self._retire = False
        self._beating: asyncio.Task[None] | None = None
        self._handle = ray.get_runtime_context().current_actor  # this incarnation, for the lifeline
        self._directory = ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
        self._directory.register_host.remote(name, self.incarnation, self._handle, True)

    async def _ready(self) -> HostCore:
        if self._core is not None:
            return self._core
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._core is None:
                register_scripts(self.config)
                store = store_from_url(self.config.store_url)
                await store.open()
                await warm_up()
                # Created by the gateway before the hosts; created here if a rollback raced its removal.
                pool = get_or_create(ToolPoolActor, tool_pool(self.generation), self.config,
                                     **placement(self.config.actor_resource))
                runtime = Runtime(registry=self.config.registry, tools=ToolPoolClient(pool), stream_model=stream_model,
                                  quotas=self.config.quotas)
                core = HostCore(
                    store, runtime, self.config.profiles, idle_ttl_s=self.config.idle_ttl_s,
                    claim=self._claim, release=self._release, quotas=self.config.quotas,
                    store_outage_s=self.config.store_outage_s,
                )
                core.start()
                self._core = core
                self._start_heartbeat()
                heap.settle()  # the loaded process out of the collector's sight (actors/heap.py)
        return self._core

    async def _claim(self, conversation_id: str) -> None:
        holder = await self._directory.claim.remote(conversation_id, self.name)
        if holder != self.name:
            raise WrongHost(holder)

    async def _release(self, conversation_id: str) -> None:
        await self._directory.release.remote(conversation_id, self.name)
        if is_dedicated(self.name):
            self._retire = True  # the heartbeat asks the Directory to end this process, outside any call

    def _start_heartbeat(self) -> None:
        if self._beating is None:
            self._beating = asyncio.get_running_loop().create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        """Re-register (a restarted Directory starts empty: it gets this host's claims and, if it
        lacks it, the configuration back) and forget gateways that went away."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self._retire and self._core is not None and not self._core.active_ids:
                self._directory.retire.remote(self.name)  # a dedicated host with nothing left to host
                return
            with contextlib.suppress(Exception):
                registration = await self._directory.register_host.remote(self.name, self.incarnation, self._handle)
                if registration.wants_config and not self._draining:
                    await self._directory.configure.remote(self.config)
                if not registration.known and self._core is not None and self._core.active_ids:
                    taken = await self._directory.reclaim.remote(self.name, self.incarnation, self._core.active_ids)
                    if taken:
                        log.error("%s: %d conversations active here are claimed by another host", self.name, len(taken))
            self._outboxes.forget_silent()

    # -- the calls a gateway makes ----------------------------------------------------------------

    def identity(self) -> tuple[str, str]:
        return self.name, self.incarnation

    def _serves(self, generation: str | None) -> None:
        """A gateway of another generation is refused — unless this host drains: then a newer
        gateway may still watch and drive what finishes here. Never two configurations writing
        one conversation."""
        if generation is not None and generation != self.generation and not self._draining:
            raise ConfigurationReplaced(generation, self.generation)

    # -- the calls the Directory makes ------------------------------------------------------------

    async def lifeline(self) -> None:
        """Never answers. The Directory holds this call open; Ray fails it when this process dies,
        which is how the Directory learns of the death at once (docs/design.md#host-death)."""
        self._start_heartbeat()
        await asyncio.get_running_loop().create_future()

    async def in_flight(self, conversation_ids: list[str]) -> list[str]:
        """Which of a dead host's conversations had work in flight, as the store tells."""
        core = await self._ready()
        return await core.in_flight(conversation_ids)

    async def adopt(self, conversation_ids: list[str]) -> list[str]:
        """Activate conversations a dead host left mid-turn: activation runs recovery, which resumes
        the turn here and now, whether or not any gateway watches them. Returns those activated."""
        core = await self._ready()
        slots = asyncio.Semaphore(ADOPT_CONCURRENCY)

        async def one(conversation_id: str) -> str | None:
            async with slots:
                try:
                    await core.activate(conversation_id)
                    return conversation_id
                except WrongHost:
                    return None  # another live host holds it, and resumes it
                except Exception:
                    log.exception("%s: adopting %s failed", self.name, conversation_id)
                    return None

        return [c for c in await asyncio.gather(*(one(c) for c in conversation_ids)) if c is not None]

    async def drain(self) -> None:
        """A newer generation is current: hand every conversation over as soon as no turn runs in it."""
        if not self._draining:
            self._draining = True
            log.info("%s: generation %s replaced: draining", self.name, self.generation)
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.get_running_loop().create_task(self._drain())

    def undrain(self) -> None:
        """This host's generation is current again (a rollback) before it was retired: it stays."""
        if self._draining:
            self._draining = False
            log.info("%s: generation %s is current again", self.name, self.generation)

    async def _drain(self) -> None:
        core = await self._ready()
        while self._draining:
            for cid in core.active_ids:
                try:
                    if await core.passivate(cid):
                        self._outboxes.relocated(cid)
                except Exception:
                    log.exception("%s: passivating %s while draining failed", self.name, cid)
            if not core.active_ids:
                await self._directory.retire.remote(self.name)  # ends this process
                return
            await asyncio.sleep(DRAIN_CHECK_S)

    async def ready(self) -> str:
        """Open the store and load LiteLLM now, so no conversation's first turn pays for it."""
        await self._ready()
        return self.name

    async def command(self, conversation_id: str, command: Command, *, generation: str | None = None) -> str:
        self._serves(generation)
        core = await self._ready()
        return str(await core.command(conversation_id, command))

    async def external(self, conversation_id: str, call: ExternalCall, *, generation: str | None = None) -> ExternalReply:
        """An external client's call through the MCP face (docs/design.md#mcp-face)."""
        self._serves(generation)
        core = await self._ready()
        return await core.external(conversation_id, call)

    async def external_view(self, conversation_id: str, session_id: str, client: ExternalClient, access: Access | None, *,
                            generation: str | None = None) -> ExternalView:
        self._serves(generation)
        core = await self._ready()
        return await core.external_view(conversation_id, session_id, client, access)

    async def external_cancel(self, conversation_id: str, call_id: str, *, generation: str | None = None) -> bool:
        self._serves(generation)
        core = await self._ready()
        return await core.external_cancel(conversation_id, call_id)

    async def delete(self, conversation_id: str, request_key: str, *, generation: str | None = None) -> str:
        """Stop the conversation, delete it from the store, tell its watchers, release its claim
        (docs/design.md#deletion). Claims it first: a host that does not hold it answers WrongHost."""
        self._serves(generation)
        core = await self._ready()
        return str(await core.delete(conversation_id, request_key))

    async def watch(self, gateway_id: str, conversation_id: str, *, generation: str | None = None) -> str:
        """Deliver this conversation's live events to `gateway_id`; activates it (so a conversation
        whose host died resumes on its new host as soon as a gateway watches it)."""
        self._serves(generation)
        core = await self._ready()
        self._outboxes.watch(gateway_id, conversation_id, core.listen)
        await core.activate(conversation_id)
        return self.incarnation

    async def activate(self, conversation_id: str, *, generation: str | None = None) -> int:
        self._serves(generation)
        core = await self._ready()
        return int(await core.activate(conversation_id))

    async def unwatch(self, gateway_id: str, conversation_id: str) -> None:
        self._outboxes.unwatch(gateway_id, conversation_id)

    async def poll(self, gateway_id: str, timeout_s: float = 1.0) -> list[Event | Relocated]:
        """One batch of everything pending for a gateway: one call per batch, never per delta."""
        return await self._outboxes.poll(gateway_id, timeout_s)

    async def idle(self, conversation_id: str, *, generation: str | None = None) -> None:
        self._serves(generation)
        core = await self._ready()
        await core.idle(conversation_id)

    async def passivate(self, conversation_id: str) -> bool:
        core = await self._ready()
        return bool(await core.passivate(conversation_id))

    async def inspect(self, conversation_id: str) -> dict[str, Any]:
        core = await self._ready()
        return dict(await core.inspect(conversation_id))

    async def stats(self) -> dict[str, Any]:
        core = await self._ready()
        return {"name": self.name, "pid": os.getpid(), "generation": self.generation, "draining": self._draining,
                **core.describe(), "active_ids": core.active_ids}

    async def shutdown(self) -> None:
        if self._core is not None:
            await self._core.close()
