"""The Directory actor: the single authority on where a conversation is active
(docs/design.md#placement), and the one that notices a host's death (docs/design.md#host-death).

A shell around `actors.hosting.placement.PlacementTable`: one named actor every gateway and host
finds, restarted by Ray if it dies (hosts re-register within a heartbeat, and re-claim what they
host). It also creates the ConversationHosts — only it does, so two gateways never race to start
the same one.

Host death is observed here, not by whoever happens to talk to the host next. Every registered
host incarnation gets a *lifeline*: a call the host never answers, which Ray fails with
`ActorDiedError` the moment the host's process is gone (SIGKILL, OOM, a lost node). The Directory
then drops the host, replaces it if it is one of the sharded hosts, and hands its conversations
over: a live host reads in the store which of them had work in flight (a turn running or
messages queued), and those are placed and activated at once — activation runs recovery, which
resumes the turn. Idle ones are placed by their next frame. No gateway and no client frame is
needed, so a turn nobody watches resumes too.

Generations (docs/design.md#generations): the Directory knows the current configuration
generation. The last gateway to start decides it: one bringing another generation makes it current
(a rollback brings an old one back); its hosts and tool pool run under names of their own, and the
replaced generation's hosts drain — they finish what runs, passivate, tell their watchers where to
look, and are retired once empty. A running gateway of a replaced generation is refused from then
on. Placement is one table across generations, so a conversation is never active in two.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors.hosting.backend import ConfigurationReplaced
from actors.hosting.placement import NoLiveHost, PlacementTable
from actors.ray import generation as generations
from actors.ray.config import RayConfig
from actors.ray.host import ConversationHost, Registration
from actors.ray.names import (
    NAMESPACE,
    dedicated_host,
    generation_of,
    is_dedicated,
    placement,
    sharded_host,
    sharded_index,
    tool_pool,
)

log = logging.getLogger("reactgate.ray.directory")

PROBE_TIMEOUT_S = 5.0      # a reported host that answers within this is alive, whatever the report said
REPLACE_TIMEOUT_S = 120.0  # how long a dead sharded host's name may stay taken before we give up replacing it
CHECK_TIMEOUT_S = 120.0    # an in-flight check may wait for a replacement's cold start; a hung host is skipped
RETRY_MAX_S = 1.0


@ray.remote(num_cpus=0, max_restarts=-1)
class Directory:
    """Placement, single activation, host incarnations and host death (never Ray's get_if_exists).

    An async actor: every method runs on its one event loop, so the table has a single writer."""

    def __init__(self) -> None:
        self.table = PlacementTable()
        self.incarnations: dict[str, str] = {}
        self.handles: dict[str, Any] = {}           # host name → the handle of its registered incarnation
        self._config: RayConfig | None = None       # the current generation's: what hosts are built from
        self._replaced: dict[str, str] = {}         # generation → the one that replaced it (never current again)
        self._hosts_wanted = 0
        self._orphans: dict[str, str] = {}          # conversation → the dead host it was assigned to
        self._handing_over: asyncio.Task[None] | None = None
        self._joined = asyncio.Event()              # a host registered: orphans may have a place now
        self._tasks: set[asyncio.Task[Any]] = set()
        self._resumed = 0

    # -- hosts ---------------------------------------------------------------------------------------

    async def register_host(self, name: str, incarnation: str, handle: Any, fresh: bool = False) -> Registration:
        """A host's start (`fresh`) and its heartbeats."""
        known = self.incarnations.get(name)
        if known == incarnation:
            return Registration(known=True, wants_config=self._config is None)
        if known is not None:
            if not fresh:  # a heartbeat the replaced incarnation sent before it died, arriving late
                return Registration(known=True, wants_config=self._config is None)
            # Ray names are unique: a new process holding the name means the old one is gone. Its
            # conversations must not stay assigned to the name, where nothing would activate them.
            self._died(name, known)
        self.incarnations[name] = incarnation
        self.handles[name] = handle
        if self._is_replaced(name):
            self.table.drain(name)  # e.g. re-registering with a restarted Directory: still draining
            handle.drain.remote()
        else:
            self.table.add_host(name, dedicated=is_dedicated(name))
        self._spawn(self._lifeline(name, incarnation, handle))
        self._joined.set()
        if self._orphans:
            self._hand_over_soon()
        return Registration(known=fresh, wants_config=self._config is None)

    async def reclaim(self, name: str, incarnation: str, conversation_ids: list[str]) -> list[str]:
        """A host this (restarted) Directory did not know re-claims what it hosts; returns the ids
        another live host holds."""
        if self.incarnations.get(name) != incarnation:
            return []
        return [cid for cid in conversation_ids
                if self.table.claim(cid, name, dedicated=is_dedicated(name)) != name]

    async def configure(self, config: RayConfig) -> None:
        """A host of the current generation gives a restarted Directory the configuration
        replacements are built from (a draining host never does)."""
        if self._config is None:
            self._make_current(config)

    async def host_failed(self, name: str, incarnation: str) -> None:
        """A gateway could not reach a host. Believed only once the host does not answer either:
        a false death would hand its live conversations to a second host."""
        if self.incarnations.get(name) != incarnation:
            return  # already handled, or a newer incarnation holds the name
        handle = self.handles.get(name)
        if handle is not None:
            try:
                await asyncio.wait_for(handle.identity.remote(), PROBE_TIMEOUT_S)
                return
            except ActorDiedError:
                pass
            except Exception:
                return  # unreachable for now, not known dead: the lifeline decides
        self._died(name, incarnation)

    async def _lifeline(self, name: str, incarnation: str, handle: Any) -> None:
        while self.incarnations.get(name) == incarnation:
            try:
                await handle.lifeline.remote()  # never answers while the host lives
            except ActorUnavailableError:
                await asyncio.sleep(RETRY_MAX_S)  # unreachable for a moment: not dead
                continue
            except RayActorError:
                break
            except Exception:
                log.exception("lifeline of %s failed", name)
                await asyncio.sleep(RETRY_MAX_S)
        self._died(name, incarnation)

    def _died(self, name: str, incarnation: str) -> None:
        if self.incarnations.get(name) != incarnation:
            return  # reported before, or a newer incarnation registered
        del self.incarnations[name]
        self.handles.pop(name, None)
        moved = self.table.host_failed(name)
        log.warning("host %s (%s) died holding %d conversations", name, incarnation[:8], len(moved))
        for cid in moved:
            self._orphans[cid] = name
        if self._orphans:
            self._hand_over_soon()
        index = sharded_index(name)
        if index is not None and index < self._hosts_wanted and not self._is_replaced(name):
            self._spawn(self._replace(name))
        self._close_generation_if_empty(generation_of(name))

    async def _replace(self, name: str) -> None:
        """Start a new process for a dead sharded host. Its name may stay taken for a moment after
        the death (Ray frees it once the actor is marked dead): retry until free or registered."""
        deadline = time.monotonic() + REPLACE_TIMEOUT_S
        delay = 0.05
        while name not in self.incarnations and self._config is not None:
            with contextlib.suppress(ValueError):
                ray.get_actor(name, namespace=NAMESPACE)
                return  # a replacement exists (ensure_hosts made it): it registers itself
            if self._create(name, self._config, num_cpus=self._config.host_num_cpus):
                return
            if time.monotonic() > deadline:
                log.error("could not replace host %s: its name stayed taken", name)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _create(self, name: str, config: RayConfig, *, num_cpus: float) -> bool:
        try:
            handle = ConversationHost.options(  # type: ignore[attr-defined]
                name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=num_cpus,
                **placement(config.actor_resource),
            ).remote(name, config)
        except ValueError:
            return False  # the name is taken: by a process that just died, or by another creation
        self.handles.setdefault(name, handle)
        handle.ready.remote()  # open the store and load LiteLLM now, before any conversation needs it
        return True

    # -- handing over a dead host's conversations ------------------------------------------------------

    def _hand_over_soon(self) -> None:
        if self._handing_over is None or self._handing_over.done():
            self._handing_over = self._spawn(self._hand_over())

    async def _hand_over(self) -> None:
        """Resume now, on live hosts, every orphan with work in flight; leave the idle ones unplaced."""
        delay = 0.05
        while self._orphans:
            checker = await self._live_host()
            orphans = dict(self._orphans)
            try:
                busy = await asyncio.wait_for(self.handles[checker].in_flight.remote(list(orphans)), CHECK_TIMEOUT_S)
            except Exception as exc:  # that host died too (its lifeline says so), hangs, or its store failed
                log.warning("in-flight check on %s failed (%s): retrying", checker, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = 0.05
            for cid, dead in orphans.items():
                if self._orphans.get(cid) == dead:
                    del self._orphans[cid]
            targets: dict[str, list[str]] = {}
            for cid in busy:
                host = self._place_orphan(cid, orphans[cid])
                if host is not None:
                    targets.setdefault(host, []).append(cid)
            for host, cids in targets.items():
                self._spawn(self._adopt(host, cids))

    async def _live_host(self) -> str:
        while True:
            live = [h for h in sorted(self.table.live) or sorted(self.table.dedicated) if h in self.handles]
            if live:
                return live[0]
            self._joined.clear()
            await self._joined.wait()

    def _place_orphan(self, conversation_id: str, dead: str) -> str | None:
        if is_dedicated(dead):
            if self._config is None:
                self._orphans[conversation_id] = dead  # until a host or gateway tells us how to build one
                return None
            return self._ensure_dedicated(conversation_id, self._config)
        try:
            return self.table.place(conversation_id)
        except NoLiveHost:
            self._orphans[conversation_id] = dead
            return None

    async def _adopt(self, host: str, conversation_ids: list[str]) -> None:
        handle = self.handles.get(host)
        try:
            if handle is None:
                raise ActorDiedError()
            resumed = await handle.adopt.remote(conversation_ids)
            self._resumed += len(resumed)
        except RayActorError:
            # Died before activating them. A registered host's lifeline hands them over again (they
            # are assigned to it); one that never registered has no lifeline: hand them over here,
            # after a pause (a dedicated host's dead name may linger a moment).
            if host not in self.incarnations:
                await asyncio.sleep(RETRY_MAX_S)
                for cid in self.table.host_failed(host):
                    self._orphans[cid] = host
                self._hand_over_soon()
        except Exception:
            log.exception("adoption on %s failed", host)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- placement ---------------------------------------------------------------------------------------

    async def place(self, conversation_id: str, generation: str | None = None) -> str:
        """The conversation's host; a gateway of a replaced generation is refused (ConfigurationReplaced)."""
        if generation is not None:
            self._refuse_replaced(generation)
        return self.table.place(conversation_id)

    async def claim(self, conversation_id: str, host: str) -> str:
        return self.table.claim(conversation_id, host, dedicated=is_dedicated(host))

    async def release(self, conversation_id: str, host: str) -> None:
        self.table.release(conversation_id, host)

    async def hosts(self) -> list[str]:
        return sorted(self.table.live)

    async def holder(self, conversation_id: str) -> str | None:
        """For operators and tests: the host the conversation is assigned to, if any."""
        return self.table.assigned.get(conversation_id)

    async def load(self) -> dict[str, int]:
        return self.table.load()

    async def handovers(self) -> dict[str, int]:
        """For operators, tests and benches: conversations resumed by a hand-over, and still waiting."""
        return {"resumed": self._resumed, "orphans": len(self._orphans)}

    # -- generations -------------------------------------------------------------------------------------

    async def generation(self) -> str | None:
        return self._config.generation if self._config is not None else None

    async def check(self, generation: str, sections: Mapping[str, str] | None = None) -> None:
        """Raises ConfigurationReplaced if a gateway of `generation` may no longer serve; given its
        `sections`, the message names what differs from the current configuration."""
        self._refuse_replaced(generation, sections)

    def _refuse_replaced(self, generation: str, sections: Mapping[str, str] | None = None) -> None:
        if generation in self._replaced:
            current = self._config
            changed = generations.differences(sections, current.sections) if sections and current else []
            raise ConfigurationReplaced(generation, current.generation if current else None, changed)

    def _is_replaced(self, host: str) -> bool:
        generation = generation_of(host)
        return self._config is not None and generation is not None and generation != self._config.generation

    def _make_current(self, config: RayConfig) -> None:
        """Make `config`'s generation current; the one it replaces drains."""
        current = self._config
        if current is not None and current.generation == config.generation:
            return
        if self._replaced.pop(config.generation, None) is not None:
            log.warning("configuration generation %s returns (a rollback)", config.generation)
        self._config = config
        self._hosts_wanted = config.hosts
        if current is None:
            for name, handle in self.handles.items():  # a restarted Directory: hosts it met before
                if self._is_replaced(name):
                    self.table.drain(name)
                    handle.drain.remote()
            return
        self._replaced[current.generation] = config.generation
        changed = generations.differences(config.sections, current.sections)
        log.warning("configuration generation %s replaces %s (changed: %s); draining %s's hosts",
                    config.generation, current.generation, ", ".join(changed) or "nothing", current.generation)
        for name, handle in list(self.handles.items()):
            if generation_of(name) == current.generation:
                self.table.drain(name)
                handle.drain.remote()
            elif generation_of(name) == config.generation and name in self.table.draining:
                self.table.undrain(name, dedicated=is_dedicated(name))  # still there from before the rollback
                handle.undrain.remote()
        self._close_generation_if_empty(current.generation)

    def _close_generation_if_empty(self, generation: str | None) -> None:
        """A replaced generation's tool pool goes once the last of its hosts has."""
        if generation is None or generation not in self._replaced:
            return
        if any(generation_of(name) == generation for name in self.incarnations):
            return
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(tool_pool(generation), namespace=NAMESPACE))
            log.info("generation %s has no host left: its tool pool is gone", generation)

    async def ensure_hosts(self, count: int, config: RayConfig) -> list[str]:
        """Create the named sharded hosts of `config`'s generation that do not exist yet (only the
        Directory creates them). A new generation becomes current; a replaced one is refused."""
        self._make_current(config)
        self._hosts_wanted = max(self._hosts_wanted, count)
        names = []
        for i in range(count):
            name = sharded_host(config.generation, i)
            names.append(name)
            if name in self.incarnations:
                continue
            with contextlib.suppress(ValueError):
                ray.get_actor(name, namespace=NAMESPACE)
                continue
            self._create(name, config, num_cpus=config.host_num_cpus)
        return names

    async def ensure_dedicated(self, conversation_id: str, config: RayConfig) -> str:
        """`placement = "dedicated"`: one named actor for this conversation, created once."""
        self._make_current(config)
        return self._ensure_dedicated(conversation_id, config)

    def _ensure_dedicated(self, conversation_id: str, config: RayConfig) -> str:
        holder = self.table.assigned.get(conversation_id)
        if holder is not None and self.table.alive(holder) and holder in self.table.draining:
            return holder  # the old generation's host finishes its turn; the next activation comes here
        name = dedicated_host(config.generation, conversation_id)
        if name not in self.incarnations:
            try:
                ray.get_actor(name, namespace=NAMESPACE)
            except ValueError:
                self._create(name, config, num_cpus=0)
        self.table.assign(conversation_id, name, dedicated=True)
        return name

    async def retire(self, name: str) -> None:
        """A dedicated host whose conversation was passivated, or a drained host of a replaced
        generation: its process goes away (~92 MB)."""
        if not is_dedicated(name) and name not in self.table.draining:
            return
        self.table.host_failed(name)
        self.incarnations.pop(name, None)  # first: its lifeline's failure is then no death to handle
        self.handles.pop(name, None)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        self._close_generation_if_empty(generation_of(name))
