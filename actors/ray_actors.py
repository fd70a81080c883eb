"""The Ray shells: Directory, ConversationHost, ToolPool (SPEC §5).

Each is thin: the logic lives in plain classes (PlacementTable, HostCore, LocalToolExecutor +
DurableTools) that the tests construct without Ray. What the shells add is what only Ray has:
named actors that every gateway finds, process isolation, and restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.catalog import Catalog, Observation, ToolCall
from actors.placement import NoLiveHost, PlacementTable
from actors.profile import AgentProfile
from protocol.events import Event

log = logging.getLogger("reactgate.ray")

NAMESPACE = "reactgate"
DIRECTORY_NAME = "reactgate-directory"
TOOL_POOL_NAME = "reactgate-toolpool"
HOST_PREFIX = "reactgate-host-"
DEDICATED_PREFIX = "reactgate-conv-"
GATEWAY_TIMEOUT_S = 60.0     # a gateway that has not polled for this long is presumed gone


@dataclass(frozen=True)
class ClusterConfig:
    """What every host and the tool pool need to build their part of the runtime."""

    store_url: str
    profiles: Mapping[str, AgentProfile]
    scripts: Mapping[str, str] = field(default_factory=dict)  # script name → file, played as scripted/<name>
    idle_ttl_s: float = 600.0
    host_num_cpus: float = 0.0
    tool_max_concurrency_per_conversation: int = 4
    tool_max_concurrency_global: int = 64
    extra: dict[str, Any] = field(default_factory=dict)


def _register_scripts(config: ClusterConfig) -> None:
    """The scripted model's registry is per process: every host registers the cluster's scripts."""
    from actors.llm.scripts import register_script

    for name, path in config.scripts.items():
        register_script(name, Path(path))


def _store_url(config: ClusterConfig) -> str:
    """A worker's own REACTGATE_STORE wins (k8s puts the DSN there from a Secret); else the gateway's."""
    return os.environ.get("REACTGATE_STORE") or config.store_url


def _is_dedicated(host: str) -> bool:
    return host.startswith(DEDICATED_PREFIX)


class WrongHost(Exception):
    """Another live host holds this conversation's activation; route there."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


# -- Directory -------------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_restarts=-1)
class Directory:
    """The single authority on where a conversation is active (never Ray's get_if_exists)."""

    def __init__(self) -> None:
        self.table = PlacementTable()
        self.incarnations: dict[str, str] = {}

    def register_host(self, name: str, incarnation: str) -> None:
        self.incarnations[name] = incarnation
        self.table.add_host(name, dedicated=_is_dedicated(name))

    def host_failed(self, name: str, incarnation: str) -> list[str]:
        if self.incarnations.get(name) != incarnation:
            return []  # already replaced by a newer incarnation
        self.incarnations.pop(name, None)
        return self.table.host_failed(name)

    def place(self, conversation_id: str) -> str:
        return self.table.place(conversation_id)

    def claim(self, conversation_id: str, host: str) -> str:
        return self.table.claim(conversation_id, host, dedicated=_is_dedicated(host))

    def release(self, conversation_id: str, host: str) -> None:
        self.table.release(conversation_id, host)

    def hosts(self) -> list[str]:
        return sorted(self.table.live)

    def load(self) -> dict[str, int]:
        return self.table.load()

    def ensure_hosts(self, count: int, config: ClusterConfig) -> list[str]:
        """Create the named sharded hosts that do not exist yet (only the Directory creates them)."""
        names = []
        for i in range(count):
            name = f"{HOST_PREFIX}{i}"
            names.append(name)
            with contextlib.suppress(ValueError):
                ray.get_actor(name, namespace=NAMESPACE)
                continue
            ConversationHost.options(  # type: ignore[attr-defined]
                name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=config.host_num_cpus,
            ).remote(name, config)
        return names

    def ensure_dedicated(self, conversation_id: str, config: ClusterConfig) -> str:
        """`placement = "dedicated"`: one named actor for this conversation, created once."""
        name = f"{DEDICATED_PREFIX}{conversation_id}"
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            ConversationHost.options(  # type: ignore[attr-defined]
                name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
            ).remote(name, config)
        self.table.add_host(name, dedicated=True)
        self.table.assigned[conversation_id] = name
        return name

    def retire(self, name: str) -> None:
        """A dedicated host whose conversation was passivated: its process goes away (~90 MB)."""
        if not _is_dedicated(name):
            return
        self.table.host_failed(name)
        self.incarnations.pop(name, None)
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))


# -- ConversationHost ----------------------------------------------------------------------------


@ray.remote(max_restarts=0, max_concurrency=1000)  # type: ignore[call-overload]  # stubs lack actor options
class ConversationHost:
    """Hosts many conversations (a HostCore); delivers their events to each gateway in batches."""

    def __init__(self, name: str, config: ClusterConfig) -> None:
        self.name = name
        self.incarnation = uuid.uuid4().hex
        self.config = config
        self._core: Any = None
        self._starting: asyncio.Lock | None = None
        self._outboxes: dict[str, list[Event]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._watches: dict[tuple[str, str], Any] = {}    # (gateway, conversation) → unsubscribe
        self._last_poll: dict[str, float] = {}
        self._retire = False
        self._directory = ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
        self._directory.register_host.remote(name, self.incarnation)

    async def _ready(self) -> Any:
        if self._core is not None:
            return self._core
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._core is None:
                from actors.conversation import Runtime
                from actors.host import HostCore
                from actors.llm.stream import stream_model, warm_up
                from actors.store import store_from_url
                from actors.tools.demo import demo_registry

                _register_scripts(self.config)
                store = store_from_url(_store_url(self.config))
                await store.open()
                await warm_up()
                pool = ray.get_actor(TOOL_POOL_NAME, namespace=NAMESPACE)
                runtime = Runtime(registry=demo_registry(), tools=ToolPoolClient(pool), stream_model=stream_model)
                core = HostCore(
                    store, runtime, self.config.profiles, idle_ttl_s=self.config.idle_ttl_s,
                    claim=self._claim, release=self._release,
                )
                core.start()
                asyncio.get_running_loop().create_task(self._heartbeat())
                self._core = core
        return self._core

    async def _claim(self, conversation_id: str) -> None:
        holder = await self._directory.claim.remote(conversation_id, self.name)
        if holder != self.name:
            raise WrongHost(holder)

    async def _release(self, conversation_id: str) -> None:
        await self._directory.release.remote(conversation_id, self.name)
        if _is_dedicated(self.name):
            self._retire = True  # the heartbeat asks the Directory to end this process, outside any call

    async def _heartbeat(self) -> None:
        """Re-register (a restarted Directory starts empty) and forget gateways that went away."""
        while True:
            await asyncio.sleep(5.0)
            if self._retire and self._core is not None and not self._core.active_ids:
                self._directory.retire.remote(self.name)  # a dedicated host with nothing left to host
                return
            with contextlib.suppress(Exception):
                await self._directory.register_host.remote(self.name, self.incarnation)
            now = time.monotonic()
            for gateway, seen in list(self._last_poll.items()):
                if now - seen > GATEWAY_TIMEOUT_S:
                    self._drop_gateway(gateway)

    # -- the calls a gateway makes ----------------------------------------------------------------

    def identity(self) -> tuple[str, str]:
        return self.name, self.incarnation

    async def ready(self) -> str:
        """Open the store and load LiteLLM now, so no conversation's first turn pays for it."""
        await self._ready()
        return self.name

    async def command(self, conversation_id: str, command: Any) -> str:
        core = await self._ready()
        return str(await core.command(conversation_id, command))

    async def watch(self, gateway_id: str, conversation_id: str) -> str:
        """Deliver this conversation's live events to `gateway_id`; activates it (so a conversation
        whose host died resumes on its new host as soon as a gateway watches it)."""
        core = await self._ready()
        key = (gateway_id, conversation_id)
        self._outboxes.setdefault(gateway_id, [])
        self._wakeups.setdefault(gateway_id, asyncio.Event())
        self._last_poll.setdefault(gateway_id, time.monotonic())
        if key not in self._watches:
            def deliver(batch: Sequence[Event], gateway: str = gateway_id) -> None:
                box = self._outboxes.get(gateway)
                if box is not None:
                    box.extend(batch)
                    self._wakeups[gateway].set()
            self._watches[key] = core.listen(conversation_id, deliver)
        await core.activate(conversation_id)
        return self.incarnation

    async def activate(self, conversation_id: str) -> int:
        core = await self._ready()
        return int(await core.activate(conversation_id))

    async def unwatch(self, gateway_id: str, conversation_id: str) -> None:
        unsubscribe = self._watches.pop((gateway_id, conversation_id), None)
        if unsubscribe is not None:
            unsubscribe()

    async def poll(self, gateway_id: str, timeout_s: float = 1.0) -> list[Event]:
        """One batch of everything pending for a gateway: one call per batch, never per delta."""
        self._last_poll[gateway_id] = time.monotonic()
        wake = self._wakeups.setdefault(gateway_id, asyncio.Event())
        box = self._outboxes.setdefault(gateway_id, [])
        if not box:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout_s)
        wake.clear()
        batch, self._outboxes[gateway_id] = self._outboxes.get(gateway_id, []), []
        return batch

    async def idle(self, conversation_id: str) -> None:
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
        return {"name": self.name, "pid": os.getpid(), **core.describe(), "active_ids": core.active_ids}

    async def shutdown(self) -> None:
        if self._core is not None:
            await self._core.close()

    def _drop_gateway(self, gateway_id: str) -> None:
        for key in [k for k in self._watches if k[0] == gateway_id]:
            self._watches.pop(key)()
        self._outboxes.pop(gateway_id, None)
        self._wakeups.pop(gateway_id, None)
        self._last_poll.pop(gateway_id, None)


# -- ToolPool ----------------------------------------------------------------------------------------


class ToolPoolClient:
    """The host's tool executor: calls the pool; a pool that dies mid-call still yields observations."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: Sequence[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None,
    ) -> list[Observation]:
        try:
            return list(await self.pool.execute_batch.remote(
                conversation_id, turn_id, list(calls), exploration_cap=exploration_cap,
                timeout_s=timeout_s, catalog=catalog,
            ))
        except (RayActorError, RayTaskError) as exc:
            log.warning("tool pool failed during a batch of %s: %s", conversation_id, type(exc).__name__)
            return [
                Observation(c.call_id, c.tool_id, ok=False, error="tool_pool_unavailable",
                            detail={"message": "the tool pool failed while this call ran"})
                for c in calls
            ]

    async def reset_exploration(self, conversation_id: str) -> None:
        with contextlib.suppress(RayActorError, RayTaskError):
            await self.pool.reset_exploration.remote(conversation_id)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000)  # type: ignore[call-overload]
class ToolPool:
    """Executes tool calls for every host: trait re-check, durable per-conversation exploration
    counters, concurrency caps, timeouts, durable results deduplicated by call id."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self._ready_lock: asyncio.Lock | None = None
        self._store: Any = None
        self._executor: Any = None
        self._durable: Any = None
        self._loaded: set[str] = set()
        self._versions: dict[str, int] = {}
        self._inflight: dict[tuple[str, str], asyncio.Future[Observation]] = {}

    async def _ready(self) -> None:
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if self._store is None:
                from actors.store import store_from_url
                from actors.tools.demo import demo_registry
                from actors.tools.durable import DurableTools
                from actors.tools.executor import LocalToolExecutor

                store = store_from_url(_store_url(self.config))
                await store.open()
                self._executor = LocalToolExecutor(
                    demo_registry(),
                    max_concurrency_per_conversation=self.config.tool_max_concurrency_per_conversation,
                    max_concurrency_global=self.config.tool_max_concurrency_global,
                )
                self._durable = DurableTools(self._executor, store)
                self._store = store

    def _state_key(self, conversation_id: str) -> str:
        return f"toolpool/{conversation_id}"

    async def _load(self, conversation_id: str) -> None:
        """Counters are durable: a restarted pool picks them up where they were (SPEC §4.3)."""
        if conversation_id in self._loaded:
            return
        snap = await self._store.load_snapshot(self._state_key(conversation_id))
        if snap is not None:
            self._versions[conversation_id] = snap[0]
            self._executor.import_conversation(conversation_id, json.loads(snap[1]))
        self._loaded.add(conversation_id)

    async def _save(self, conversation_id: str) -> None:
        version = self._versions.get(conversation_id, 0) + 1
        self._versions[conversation_id] = version
        data = json.dumps(self._executor.export_conversation(conversation_id)).encode()
        await self._store.save_snapshot(self._state_key(conversation_id), version, data)

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: list[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None,
    ) -> list[Observation]:
        await self._ready()
        await self._load(conversation_id)
        # A batch re-submitted after a host crash joins the calls still in flight here.
        joined = {c.call_id: self._inflight[(conversation_id, c.call_id)]
                  for c in calls if (conversation_id, c.call_id) in self._inflight}
        fresh = [c for c in calls if c.call_id not in joined]
        loop = asyncio.get_running_loop()
        mine = {c.call_id: loop.create_future() for c in fresh}
        for call_id, fut in mine.items():
            self._inflight[(conversation_id, call_id)] = fut
        try:
            if fresh:
                results = await self._durable.execute_batch(
                    conversation_id, turn_id, fresh, exploration_cap=exploration_cap,
                    timeout_s=timeout_s, catalog=catalog,
                )
                await self._save(conversation_id)
                for obs in results:
                    mine[obs.call_id].set_result(obs)
            out = {cid: await asyncio.shield(f) for cid, f in {**joined, **mine}.items()}
            return [out[c.call_id] for c in calls]
        except BaseException as exc:
            for fut in mine.values():
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
                    fut.exception()
            raise
        finally:
            for call_id in mine:
                self._inflight.pop((conversation_id, call_id), None)

    async def reset_exploration(self, conversation_id: str) -> None:
        await self._ready()
        await self._load(conversation_id)
        await self._executor.reset_exploration(conversation_id)
        await self._save(conversation_id)

    async def workspace(self, conversation_id: str) -> dict[str, Any]:
        await self._ready()
        await self._load(conversation_id)
        return dict(self._executor.export_conversation(conversation_id))

    def stats(self) -> dict[str, Any]:
        executed = dict(self._durable.executed) if self._durable is not None else {}
        return {"pid": os.getpid(), "executed": executed, "inflight": len(self._inflight)}


def get_or_create(actor_cls: Any, name: str, *args: Any, **options: Any) -> Any:
    """Create a named actor, or take the one that exists. Creation is atomic in Ray's GCS: of two
    racing creators, one gets ValueError and takes the winner's actor (no get_if_exists)."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    try:
        return actor_cls.options(name=name, namespace=NAMESPACE, lifetime="detached", **options).remote(*args)
    except ValueError:
        return ray.get_actor(name, namespace=NAMESPACE)


__all__ = [
    "DIRECTORY_NAME", "NAMESPACE", "TOOL_POOL_NAME", "ClusterConfig", "ConversationHost", "Directory",
    "NoLiveHost", "ToolPool", "ToolPoolClient", "WrongHost", "get_or_create",
]
