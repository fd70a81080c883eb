"""The `ray` backend: the gateway as a Ray driver routing to ConversationHosts (docs/design.md#hosting).

- Placement: the Directory names a conversation's host (rendezvous hashing, single activation,
  docs/design.md#placement).
- Events: one long-lived batched pull per (host, gateway) pair — `host.poll` returns everything
  pending for this gateway — never one Ray call per delta (docs/design.md#delivery).
- Faults: the Directory observes a host's death itself and resumes its in-flight conversations
  on live hosts (docs/design.md#host-death). This gateway, for its part, forgets the dead host's
  routes and re-watches what its subscribers watched there, on the new host, until that works;
  subscribers are then told to look in the store, which holds every event ever published
  (write-ahead), so nothing is lost (docs/design.md#recovery, #delivery).
- Generations: this gateway serves its configuration's generation (docs/design.md#generations).
  Starting, it makes that generation current (or is refused, if it was replaced); once a newer one
  is current it stops serving (`on_replaced`): its clients resume on a current gateway.

Configuration is the `RayConfig` it is given; it reads nothing from the environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.external_call import Access, ExternalCall, ExternalReply, ExternalView
from actors.hosting.backend import AckStatus, Command, ConfigurationReplaced, Export, Opened, SetMode
from actors.hosting.export import export_log
from actors.hosting.listing import agent_list, conversation_page
from actors.hosting.meter import Meter
from actors.hosting.owners import Owners, deletion_key
from actors.hosting.placement import NoLiveHost
from actors.hosting.subscription import Direct, replay_then_live
from actors.identity import Owner
from actors.quotas import TenantUsage
from actors.ray.config import RayConfig
from actors.ray.directory import Directory
from actors.ray.host import WrongHost
from actors.ray.names import DIRECTORY_NAME, NAMESPACE, placement, tool_pool
from actors.ray.outbox import Relocated
from actors.ray.singletons import get_or_create
from actors.ray.tool_pool import ToolPoolActor
from actors.store import Store, StoreHealth, store_from_url
from actors.store.outage import checked_health
from protocol.events import Event, ExternalClient
from protocol.frames import AgentList, ConversationPage, Mode

log = logging.getLogger("reactgate.ray.backend")

Listener = Callable[[Sequence[Event]], None]
T = TypeVar("T")
ROUTE_ATTEMPTS = 5           # WrongHost redirects followed at once, before backing off
ROUTE_TIMEOUT_S = 60.0       # how long a call keeps re-routing while hosts die and replacements start
RETRY_MAX_S = 1.0
POLL_TIMEOUT_S = 1.0


class _HostGone(Exception):
    """The host a route names has no actor now: it died, and its replacement does not exist yet."""


def _cause(exc: RayTaskError) -> BaseException:
    """The exception our code raised inside the actor, unwrapped from Ray's task error."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else exc


class _HostLink:
    """This gateway's batched event stream from one host: a long poll, batch after batch, until the
    host is unreachable; then `on_failure` runs once, from the pump itself."""

    def __init__(
        self, name: str, handle: Any, gateway_id: str,
        on_batch: Callable[[Sequence[Event | Relocated]], None],
        on_failure: Callable[[_HostLink], Awaitable[None]],
    ) -> None:
        self.name = name
        self.handle = handle
        self.incarnation: str | None = None
        self.watched: set[str] = set()
        self._gateway_id = gateway_id
        self._on_batch = on_batch
        self._on_failure = on_failure
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        while True:
            try:
                batch = await self.handle.poll.remote(self._gateway_id, POLL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # whatever broke the stream, the conversations need a new one
                log.warning("host %s unreachable (%s): failing over", self.name, type(exc).__name__)
                await self._on_failure(self)
                return
            if batch:
                self._on_batch(batch)


class RayBackend:
    def __init__(self, config: RayConfig, *, default_agent: str, directory: Any = None) -> None:
        self.config = config
        self.profiles = dict(config.profiles)
        self.default_agent = default_agent
        self.gateway_id = f"gw-{uuid.uuid4().hex[:12]}"
        self.generation: str | None = config.generation
        # Called once when a newer generation replaces this one (the server drains: 1012, not ready).
        self.on_replaced: Callable[[ConfigurationReplaced], None] | None = None
        self._replaced: ConfigurationReplaced | None = None
        self.store: Store = store_from_url(config.store_url)
        # Creating a conversation is charged here, in the gateway process, against the store every
        # gateway and host shares (docs/design.md#quotas); turns and tokens are charged on the hosts.
        self.meter = Meter(self.store, config.quotas)
        self.owners = Owners(self.store, self.meter)
        self._started_ray = False
        # The Directory actor; None: the cluster's named one, created at `start` if missing. A test
        # passes a stand-in that answers as the real one does between a host's death and its observation.
        self._directory: Any = directory
        self._routes: dict[str, str] = {}                # conversation → host name (a cache)
        self._links: dict[str, _HostLink] = {}
        self._listeners: dict[str, list[Listener]] = {}
        self._watch_locks: dict[str, asyncio.Lock] = {}   # conversation → orders its watch/unwatch calls
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if not ray.is_initialized():
            self._init_ray()
            self._started_ray = True
        await self.store.open()
        if self._directory is None:
            self._directory = get_or_create(Directory, DIRECTORY_NAME, **placement(self.config.actor_resource))
        generation = self.config.generation
        log.info("serving configuration generation %s", generation)
        get_or_create(ToolPoolActor, tool_pool(generation), self.config, **placement(self.config.actor_resource))
        sharded = any(p.placement == "sharded" for p in self.profiles.values())
        # Makes this generation current: the one it replaces drains (docs/design.md#generations).
        names = await self._directory.ensure_hosts.remote(self.config.hosts if sharded else 0, self.config)
        if sharded:
            await self._wait_for_hosts()
            # /readyz only once every host has its store open and LiteLLM loaded (seconds each).
            await asyncio.gather(*(ray.get_actor(n, namespace=NAMESPACE).ready.remote() for n in names))

    def _init_ray(self) -> None:
        if self.config.address:
            log.info("joining the Ray cluster at %s", self.config.address)
            ray.init(address=self.config.address, namespace=NAMESPACE, include_dashboard=False)
            return
        # address="local": always a cluster of our own. A bare ray.init() would join whatever cluster
        # an earlier `ray start` recorded in /tmp/ray/ray_current_cluster, and then refuse num_cpus.
        # A fresh dict each time: Ray adds its own keys to the one it is given. The niceness goes to
        # the raylet that this call starts, which applies it to every worker process it launches.
        system_config: dict[str, Any] = {}
        if self.config.worker_niceness is not None:
            system_config["worker_niceness"] = self.config.worker_niceness
        resources = {self.config.actor_resource: 1_000.0} if self.config.actor_resource else None
        ray.init(address="local", num_cpus=self.config.local_cpus, resources=resources, namespace=NAMESPACE,
                 include_dashboard=False, _system_config=system_config)
        log.info("started a local Ray with %d CPUs", self.config.local_cpus)

    async def _wait_for_hosts(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(await self._directory.hosts.remote()) < self.config.hosts:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {self.config.hosts} ConversationHosts registered in {timeout_s} s")
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for link in list(self._links.values()):
            link.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await link.task
        self._links.clear()
        await self.store.close()
        if self._started_ray:
            ray.shutdown()

    async def store_health(self) -> StoreHealth:
        """The store as this gateway's process sees it (the hosts see their own), for /readyz and
        /metrics (docs/design.md#store-outage)."""
        return await checked_health(self.store)

    def store_counters(self) -> dict[str, float]:
        return self.store.counters()

    # -- Backend ---------------------------------------------------------------------------------

    async def open(
        self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None,
        create_missing: bool = False,
    ) -> Opened:
        conversation_id, created = await self.owners.open(
            owner, conversation_id, agent, served=self.profiles, default_agent=self.default_agent, now=time.time(),
            create_missing=create_missing,
        )
        if not created:
            # Re-opening (the gateway also opens before each subscribe) activates the conversation,
            # so a turn cut by a crash resumes now, not at the next command (docs/design.md#recovery).
            await self._call(conversation_id, "activate")
        if mode is not None:
            await self._call(conversation_id, "command", SetMode(id=f"open-{uuid.uuid4().hex}", mode=Mode(mode)))
        return Opened(conversation_id, await self.store.last_seq(conversation_id))

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        await self.owners.check(owner, conversation_id)
        return await self._call(conversation_id, "command", command)  # type: ignore[no-any-return]

    async def subscribe(self, owner: Owner, conversation_id: str, after_seq: int,
                        direct: Direct | None = None) -> AsyncIterator[list[Event]]:
        await self.owners.check(owner, conversation_id)

        async def attach(listener: Listener) -> Callable[[], None]:
            self._listeners.setdefault(conversation_id, []).append(listener)

            def detach() -> None:
                listeners = self._listeners.get(conversation_id, [])
                if listener in listeners:
                    listeners.remove(listener)
                if not listeners:
                    self._listeners.pop(conversation_id, None)
                    self._spawn(self._unwatch(conversation_id))

            try:
                await self._watch(conversation_id)
            except BaseException:  # e.g. deleted meanwhile (Forbidden): nobody else would detach it
                detach()
                raise
            return detach

        async for batch in replay_then_live(self.store, conversation_id, after_seq, attach, direct):
            yield batch

    async def delete(self, owner: Owner, conversation_id: str, request_id: str) -> AckStatus:
        key = deletion_key(owner, request_id)
        if not await self.owners.check_delete(owner, conversation_id, key):
            return "duplicate"
        try:
            # Routed like any call: the host holding the activation stops it, deletes it from the
            # store, tells its watchers (through every gateway's poll) and releases its placement.
            return await self._call(conversation_id, "delete", key)  # type: ignore[no-any-return]
        finally:
            self.owners.forget(conversation_id)
            self._routes.pop(conversation_id, None)

    async def export(self, owner: Owner, conversation_id: str, request_id: str) -> Export:
        await self.owners.check(owner, conversation_id)
        return await export_log(self.store, conversation_id, request_id, time.time())

    def agents(self) -> AgentList:
        return agent_list(self.profiles, self.default_agent)

    async def list_conversations(self, owner: Owner, limit: int, before: str | None) -> ConversationPage:
        # Read from the store every host writes the list to: no host is asked (docs/design.md#conversation-list).
        return await conversation_page(self.store, owner, limit, before)

    # -- routing -----------------------------------------------------------------------------------

    async def _link_for(self, conversation_id: str) -> _HostLink:
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
            try:
                handle = ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                # The Directory still names a host whose actor is gone: the death is a moment old
                # (not yet observed, or its replacement not yet created). A route is worth a retry,
                # not an error — see `_routed`.
                self._routes.pop(conversation_id, None)
                raise _HostGone(name) from None
            link = self._links[name] = _HostLink(name, handle, self.gateway_id, self._deliver, self._host_failed)
        return link

    async def _host_for(self, conversation_id: str) -> tuple[str, Any]:
        link = await self._link_for(conversation_id)
        return link.name, link.handle

    async def _place(self, conversation_id: str, timeout_s: float = 60.0) -> str:
        """The Directory's choice; while no host is live (one died, its replacement is starting) wait."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            try:
                return str(await self._directory.place.remote(conversation_id, self.config.generation))
            except NoLiveHost:
                if time.monotonic() > deadline:
                    raise
                await self._directory.ensure_hosts.remote(self.config.hosts, self.config)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _call(self, conversation_id: str, method: str, *args: Any) -> Any:
        return await self._routed(
            conversation_id,
            lambda link: getattr(link.handle, method).remote(conversation_id, *args, generation=self.config.generation))

    async def _routed(self, conversation_id: str, call: Callable[[_HostLink], Awaitable[T]]) -> T:
        """`call` on the conversation's host, re-routed until a live host answers or ROUTE_TIMEOUT_S.

        Why a deadline and not a few attempts: when every host dies at once, a route fails fast
        many times in a row — the Directory still names a dead host (`_HostGone`, or
        `RayActorError` through the old link) until it has observed the death, then no host is
        live until a replacement registers, and that replacement needs seconds to start. Five
        quick attempts were used up in ~40 ms; a re-watch that gave up left its subscriber
        attached to nothing, waiting for events no host would send it."""
        deadline = time.monotonic() + ROUTE_TIMEOUT_S
        delay = 0.05
        redirects = 0
        while True:
            link: _HostLink | None = None
            try:
                link = await self._link_for(conversation_id)
                result = await call(link)
                if conversation_id not in self._listeners:
                    # A route is a cache only a watched conversation keeps (see `_unwatch`); the
                    # next call of an unwatched one asks the Directory again.
                    self._routes.pop(conversation_id, None)
                return result
            except WrongHost as exc:  # another host holds the activation: go there
                self._routes[conversation_id] = exc.holder
                redirects += 1
                last: BaseException = exc
                if redirects < ROUTE_ATTEMPTS:
                    continue
            except RayTaskError as exc:  # our code raised on the host (e.g. UnknownAsk): the caller's error
                cause = _cause(exc)
                if not isinstance(cause, ConfigurationReplaced):
                    raise cause from None
                await self._check_generation()  # raises if this gateway is the replaced one
                last = cause  # a host of the replaced generation not yet told to drain: a moment
                self._routes.pop(conversation_id, None)
            except (RayActorError, _HostGone) as exc:  # the host (or the Directory) died: re-place, retry
                if link is not None:
                    await self._host_failed(link)
                else:
                    self._routes.pop(conversation_id, None)
                last = exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"no host could take conversation {conversation_id}") from last
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _check_generation(self) -> None:
        """Raise ConfigurationReplaced if a newer generation replaced this gateway's; tell `on_replaced` once."""
        if self._replaced is None:
            try:
                await self._directory.check.remote(self.config.generation, self.config.sections)
                return
            except RayTaskError as exc:
                cause = _cause(exc)
                if not isinstance(cause, ConfigurationReplaced):
                    raise cause from None
                self._replaced = cause
                log.error("%s: this gateway stops serving", cause)
                if self.on_replaced is not None:
                    self.on_replaced(cause)
        raise self._replaced

    def _watch_lock(self, conversation_id: str) -> asyncio.Lock:
        """Watch and unwatch of one conversation run one at a time, so a subscription that ends
        while another starts can never unwatch the host under the new one."""
        return self._watch_locks.setdefault(conversation_id, asyncio.Lock())

    async def _watch(self, conversation_id: str) -> None:
        async with self._watch_lock(conversation_id):
            await self._watch_host(conversation_id)

    async def _watch_host(self, conversation_id: str) -> None:
        async def watch(link: _HostLink) -> None:
            incarnation = await link.handle.watch.remote(self.gateway_id, conversation_id,
                                                         generation=self.config.generation)
            if self._links.get(link.name) is not link:
                # The link failed while this watch ran: its failover re-watched what it knew of, not
                # this conversation. Watch again, through the current link.
                raise _HostGone(link.name)
            link.incarnation = incarnation
            link.watched.add(conversation_id)

        await self._routed(conversation_id, watch)

    async def _unwatch(self, conversation_id: str) -> None:
        """The last subscriber left: stop the host's feed, and forget the route.

        The link is found by what it watches, not through the route: a delete (or a relocation)
        drops the route first, and the watch must still end. The route goes too — it is a cache
        that only a watched conversation keeps; kept for every conversation ever served, it grew
        with the conversations served, not the live ones (bench/soak.py, docs/design.md#store-outage)."""
        lock = self._watch_lock(conversation_id)
        async with lock:
            if self._listeners.get(conversation_id):
                return  # a new subscription attached meanwhile: it needs the host's feed
            link = next((link for link in self._links.values() if conversation_id in link.watched), None)
            self._routes.pop(conversation_id, None)
            if link is not None:
                link.watched.discard(conversation_id)
                with contextlib.suppress(RayActorError, RayTaskError):
                    await link.handle.unwatch.remote(self.gateway_id, conversation_id)
        if not lock.locked() and not self._listeners.get(conversation_id):
            self._watch_locks.pop(conversation_id, None)

    async def _host_failed(self, link: _HostLink) -> None:
        """Forget the dead host's link and routes, re-watch what we watched there, and report it.

        Once per link: its pump and any call through it may all find it dead, and only the first
        acts. The link is the one the failing call went through, never looked up again by name —
        by then the name may be served by a healthy replacement, whose link must live on."""
        if self._links.get(link.name) is not link:
            return
        del self._links[link.name]
        if link.task is not asyncio.current_task():  # the pump itself reports its host's death
            link.task.cancel()
        for cid in [c for c, n in self._routes.items() if n == link.name]:
            del self._routes[cid]
        for cid in link.watched:
            if cid in self._listeners:
                self._spawn(self._rewatch(cid))
        if link.incarnation is not None:
            # The Directory observes deaths itself (a lifeline per host); this report only hurries
            # it along, and the Directory believes it once the host does not answer it either.
            self._directory.host_failed.remote(link.name, link.incarnation)

    async def _rewatch(self, conversation_id: str) -> None:
        """Watch the conversation on its new host (activating it there, if the Directory's hand-over
        has not already), then have its subscribers read what they missed from the store. Retried
        for as long as anyone is subscribed: a subscriber must never be left attached to nothing."""
        while conversation_id in self._listeners:
            try:
                await self._watch(conversation_id)
                break
            except Exception:
                log.exception("re-watch of %s failed: retrying", conversation_id)
                await asyncio.sleep(RETRY_MAX_S)
        self._deliver_hint(conversation_id)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _deliver(self, batch: Sequence[Event | Relocated]) -> None:
        by_conversation: dict[str, list[Event]] = {}
        for event in batch:
            if isinstance(event, Relocated):
                self._relocated(event.conversation_id)
                continue
            by_conversation.setdefault(event.conversation_id, []).append(event)
        for cid, events in by_conversation.items():
            for listener in list(self._listeners.get(cid, ())):
                listener(events)

    def _relocated(self, conversation_id: str) -> None:
        """A draining host passivated the conversation (docs/design.md#generations): watch it where
        it activates now; the re-watch ends with a look in the store, so nothing is missed."""
        name = self._routes.pop(conversation_id, None)
        link = self._links.get(name) if name else None
        if link is not None:
            link.watched.discard(conversation_id)
        if conversation_id in self._listeners:
            self._spawn(self._rewatch(conversation_id))

    def _deliver_hint(self, conversation_id: str) -> None:
        for listener in list(self._listeners.get(conversation_id, ())):
            listener([])  # "look in the store": events the dead host published may not have arrived

    # -- for operators, tests and benches ------------------------------------------------------------

    async def host_of(self, conversation_id: str) -> str:
        """The host this gateway routes the conversation to (placing it, if it is placed nowhere)."""
        name, _ = await self._host_for(conversation_id)
        return name

    async def holder(self, conversation_id: str) -> str | None:
        """The host the Directory has the conversation assigned to; None while it is placed nowhere
        (passivated, or left by a dead host and not yet handed over)."""
        holder = await self._directory.holder.remote(conversation_id)
        return str(holder) if holder is not None else None

    async def hosts(self) -> list[str]:
        """The live sharded hosts placement picks from, as the Directory sees them."""
        return list(await self._directory.hosts.remote())

    async def ensure_hosts(self) -> list[str]:
        """Start this generation's sharded hosts that are missing now (a killed one's replacement, or
        one the Directory gave up replacing); returns their names."""
        return list(await self._directory.ensure_hosts.remote(self.config.hosts, self.config))

    async def idle(self, conversation_id: str) -> None:
        await self._call(conversation_id, "idle")

    async def quota_usage(self) -> list[TenantUsage]:
        return await self.meter.tenant_usage()

    # -- the MCP face's calls (docs/design.md#mcp-face): routed like a command --------------------------

    async def external_call(self, owner: Owner, conversation_id: str, call: ExternalCall) -> ExternalReply:
        await self.owners.check(owner, conversation_id)
        return await self._call(conversation_id, "external", call)  # type: ignore[no-any-return]

    async def external_view(self, owner: Owner, conversation_id: str, session_id: str, client: ExternalClient,
                            access: Access | None) -> ExternalView:
        await self.owners.check(owner, conversation_id)
        return await self._call(conversation_id, "external_view", session_id, client, access)  # type: ignore[no-any-return]

    async def external_cancel(self, owner: Owner, conversation_id: str, call_id: str) -> bool:
        await self.owners.check(owner, conversation_id)
        return bool(await self._call(conversation_id, "external_cancel", call_id))
