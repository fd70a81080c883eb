"""The `ray` backend: the gateway as a Ray driver routing to ConversationHosts (SPEC §5).

- Placement: the Directory names a conversation's host (rendezvous hashing, single activation).
- Events: one long-lived batched pull per (host, gateway) pair — `host.poll` returns everything
  pending for this gateway — never one Ray call per delta.
- Faults: a host that dies is reported to the Directory; its conversations are re-placed and
  re-watched, which activates them elsewhere from the store. Subscribers are told to look in the
  store, which holds every event ever published (write-ahead), so nothing is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.hosting import AckStatus, Command, Opened, Owner, SetMode, UnknownAgent
from actors.local import Owners
from actors.profile import AgentProfile
from actors.ray_actors import (
    DIRECTORY_NAME,
    NAMESPACE,
    TOOL_POOL_NAME,
    ClusterConfig,
    Directory,
    NoLiveHost,
    ToolPool,
    WrongHost,
    get_or_create,
)
from actors.store import Store, store_from_url
from actors.subscription import replay_then_live
from protocol.events import Event

log = logging.getLogger("reactgate.ray_backend")

Listener = Callable[[Sequence[Event]], None]
ROUTE_ATTEMPTS = 5


def _cause(exc: RayTaskError) -> BaseException:
    """The exception our code raised inside the actor, unwrapped from Ray's task error."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


class _HostLink:
    """This gateway's batched event stream from one host."""

    def __init__(self, backend: RayBackend, name: str, handle: Any) -> None:
        self.backend = backend
        self.name = name
        self.handle = handle
        self.incarnation: str | None = None
        self.watched: set[str] = set()
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        gateway = self.backend.gateway_id
        while True:
            try:
                batch = await self.handle.poll.remote(gateway, 1.0)
            except asyncio.CancelledError:
                raise
            except (RayActorError, RayTaskError) as exc:
                log.warning("host %s unreachable (%s): failing over", self.name, type(exc).__name__)
                await self.backend._host_failed(self)
                return
            if batch:
                self.backend._deliver(batch)


class RayBackend:
    def __init__(
        self,
        settings: Any,
        profiles: Mapping[str, AgentProfile],
        *,
        default_agent: str,
        scripts: Mapping[str, str] | None = None,
        hosts: int | None = None,
    ) -> None:
        self.settings = settings
        self.profiles = dict(profiles)
        self.default_agent = default_agent
        self.gateway_id = f"gw-{uuid.uuid4().hex[:12]}"
        self.host_count = hosts or int(os.environ.get("REACTGATE_HOSTS", "2"))
        self.config = ClusterConfig(
            store_url=settings.store,
            profiles=self.profiles,
            scripts=dict(scripts or {}),
            idle_ttl_s=settings.idle_ttl_s,
        )
        self.store: Store = store_from_url(settings.store)
        self.owners = Owners(self.store)
        self._started_ray = False
        self._directory: Any = None
        self._routes: dict[str, str] = {}                # conversation → host name (a cache)
        self._links: dict[str, _HostLink] = {}
        self._listeners: dict[str, list[Listener]] = {}

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if not ray.is_initialized():
            address = getattr(self.settings, "ray_address", None)
            if address:
                ray.init(address=address, namespace=NAMESPACE, include_dashboard=False)
            else:
                # Ray starts workers at niceness 15; here the hosts *are* the service, and at 15 they
                # yield to every other process on a shared node (bench/hosting_bench.py measured it).
                os.environ.setdefault("RAY_worker_niceness", "0")
                ray.init(num_cpus=int(os.environ.get("REACTGATE_RAY_CPUS", "2")), namespace=NAMESPACE,
                         include_dashboard=False)
            self._started_ray = True
        await self.store.open()
        self._directory = get_or_create(Directory, DIRECTORY_NAME)
        get_or_create(ToolPool, TOOL_POOL_NAME, self.config)
        if any(p.placement == "sharded" for p in self.profiles.values()):
            names = await self._directory.ensure_hosts.remote(self.host_count, self.config)
            await self._wait_for_hosts()
            # /readyz only once every host has its store open and LiteLLM loaded (seconds each).
            await asyncio.gather(*(ray.get_actor(n, namespace=NAMESPACE).ready.remote() for n in names))

    async def _wait_for_hosts(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(await self._directory.hosts.remote()) < self.host_count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {self.host_count} ConversationHosts registered in {timeout_s} s")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for link in list(self._links.values()):
            link.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await link.task
        self._links.clear()
        await self.store.close()
        if self._started_ray:
            ray.shutdown()

    # -- Backend ---------------------------------------------------------------------------------

    async def open(self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None) -> Opened:
        if conversation_id is None:
            name = agent or self.default_agent
            if name not in self.profiles:
                raise UnknownAgent(name)
            conversation_id = await self.owners.create(owner, name, time.time())
        else:
            await self.owners.check(owner, conversation_id)
            # Re-opening (the gateway also opens before each subscribe) activates the conversation,
            # so a turn cut by a crash resumes now, not at the next command (SPEC §5).
            await self._call(conversation_id, "activate")
        if mode is not None:
            await self._call(conversation_id, "command", SetMode(id=f"open-{uuid.uuid4().hex}", mode=mode))  # type: ignore[arg-type]
        return Opened(conversation_id, await self.store.last_seq(conversation_id))

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        await self.owners.check(owner, conversation_id)
        return await self._call(conversation_id, "command", command)  # type: ignore[no-any-return]

    async def subscribe(self, owner: Owner, conversation_id: str, after_seq: int) -> AsyncIterator[list[Event]]:
        await self.owners.check(owner, conversation_id)

        async def attach(listener: Listener) -> Callable[[], None]:
            self._listeners.setdefault(conversation_id, []).append(listener)
            await self._watch(conversation_id)

            def detach() -> None:
                listeners = self._listeners.get(conversation_id, [])
                if listener in listeners:
                    listeners.remove(listener)
                if not listeners:
                    self._listeners.pop(conversation_id, None)
                    asyncio.get_running_loop().create_task(self._unwatch(conversation_id))

            return detach

        async for batch in replay_then_live(self.store, conversation_id, after_seq, attach):
            yield batch

    # -- routing -----------------------------------------------------------------------------------

    async def _host_for(self, conversation_id: str) -> tuple[str, Any]:
        name = self._routes.get(conversation_id)
        if name is None:
            agent = await self.owners.agent_of(conversation_id)
            if agent in self.profiles and self.profiles[agent].placement == "dedicated":
                name = await self._directory.ensure_dedicated.remote(conversation_id, self.config)
            else:
                name = await self._place(conversation_id)
            self._routes[conversation_id] = name
        link = self._links.get(name)
        if link is None:
            handle = ray.get_actor(name, namespace=NAMESPACE)
            link = self._links[name] = _HostLink(self, name, handle)
        return name, link.handle

    async def _place(self, conversation_id: str, timeout_s: float = 60.0) -> str:
        """The Directory's choice; while no host is live (one died, its replacement is starting) wait."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                return str(await self._directory.place.remote(conversation_id))
            except NoLiveHost:
                if time.monotonic() > deadline:
                    raise
                await self._directory.ensure_hosts.remote(self.host_count, self.config)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _call(self, conversation_id: str, method: str, *args: Any) -> Any:
        last: BaseException | None = None
        for _ in range(ROUTE_ATTEMPTS):
            name, handle = await self._host_for(conversation_id)
            try:
                return await getattr(handle, method).remote(conversation_id, *args)
            except WrongHost as exc:  # another host holds the activation: go there
                self._routes[conversation_id] = exc.holder
                last = exc
            except RayTaskError as exc:  # our code raised on the host (e.g. UnknownAsk): the caller's error
                raise _cause(exc) from None
            except RayActorError as exc:  # the host died: re-place and retry
                link = self._links.get(name)
                if link is not None:
                    await self._host_failed(link)
                else:
                    self._routes.pop(conversation_id, None)
                last = exc
        raise RuntimeError(f"no host could take conversation {conversation_id}") from last

    async def _watch(self, conversation_id: str) -> None:
        for _ in range(ROUTE_ATTEMPTS):
            name, handle = await self._host_for(conversation_id)
            try:
                incarnation = await handle.watch.remote(self.gateway_id, conversation_id)
            except WrongHost as exc:
                self._routes[conversation_id] = exc.holder
                continue
            except RayTaskError as exc:
                raise _cause(exc) from None
            except RayActorError as exc:
                log.warning("watch of %s on %s failed: %r", conversation_id, name, exc)
                link = self._links.get(name)
                if link is not None:
                    await self._host_failed(link)
                continue
            link = self._links[name]
            link.incarnation = incarnation
            link.watched.add(conversation_id)
            return
        raise RuntimeError(f"could not watch conversation {conversation_id}")

    async def _unwatch(self, conversation_id: str) -> None:
        name = self._routes.get(conversation_id)
        link = self._links.get(name) if name else None
        if link is not None and conversation_id in link.watched:
            link.watched.discard(conversation_id)
            with contextlib.suppress(RayActorError, RayTaskError):
                await link.handle.unwatch.remote(self.gateway_id, conversation_id)

    async def _host_failed(self, link: _HostLink) -> None:
        """Report the death, forget the routes through it, and re-watch what we watched there."""
        if self._links.get(link.name) is link:
            del self._links[link.name]
            if link.task is not asyncio.current_task():  # the pump itself reports its host's death
                link.task.cancel()
        if link.incarnation is not None:
            with contextlib.suppress(Exception):
                await self._directory.host_failed.remote(link.name, link.incarnation)
        else:
            with contextlib.suppress(Exception):
                _, incarnation = await link.handle.identity.remote()
                await self._directory.host_failed.remote(link.name, incarnation)
        for cid in [c for c, n in self._routes.items() if n == link.name]:
            del self._routes[cid]
        for cid in link.watched:
            if cid in self._listeners:
                asyncio.get_running_loop().create_task(self._rewatch(cid))

    async def _rewatch(self, conversation_id: str) -> None:
        try:
            await self._watch(conversation_id)  # activates it on its new host: recovery runs there
        except Exception:
            log.exception("re-watch of %s failed", conversation_id)
        self._deliver_hint(conversation_id)

    def _deliver(self, batch: Sequence[Event]) -> None:
        by_conversation: dict[str, list[Event]] = {}
        for event in batch:
            by_conversation.setdefault(event.conversation_id, []).append(event)
        for cid, events in by_conversation.items():
            for listener in list(self._listeners.get(cid, ())):
                listener(events)

    def _deliver_hint(self, conversation_id: str) -> None:
        for listener in list(self._listeners.get(conversation_id, ())):
            listener([])  # "look in the store": events the dead host published may not have arrived

    # -- for tests and benches ---------------------------------------------------------------------

    async def host_of(self, conversation_id: str) -> str:
        name, _ = await self._host_for(conversation_id)
        return name

    async def idle(self, conversation_id: str) -> None:
        await self._call(conversation_id, "idle")
