"""The Directory actor: the single authority on where a conversation is active
(docs/design.md#placement), and the one that notices a host's death (docs/design.md#host-death).

A shell around `DirectoryCore` (`actors/ray/directory_core.py`), which decides; this actor carries
out its effects with what only Ray has. It is one named actor every gateway and host finds,
restarted by Ray if it dies (hosts re-register within a heartbeat, and re-claim what they host).
It creates the ConversationHosts — only it does, so two gateways never race to start the same one.

Host death is observed here, not by whoever happens to talk to the host next. Every registered
host incarnation gets a *lifeline*: a call the host never answers, which Ray fails with
`ActorDiedError` the moment the host's process is gone (SIGKILL, OOM, a lost node). The core then
drops the host and names what follows: a replacement, and a hand-over — a live host reads in the
store which of its conversations had work in flight, and those are adopted at once (activation
runs recovery, which resumes the turn), so a turn nobody watches resumes too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

from actors.ray.config import RayConfig
from actors.ray.directory_core import (
    Adopt,
    DirectoryCore,
    Drain,
    Effect,
    HandOver,
    Registration,
    RemoveToolPool,
    ReplaceHost,
    Retire,
    StartHost,
    Undrain,
    WatchLifeline,
)
from actors.ray.host import ConversationHost
from actors.ray.names import NAMESPACE, placement, tool_pool

log = logging.getLogger("reactgate.ray.directory")

PROBE_TIMEOUT_S = 5.0      # a reported host that answers within this is alive, whatever the report said
REPLACE_TIMEOUT_S = 120.0  # how long a dead sharded host's name may stay taken before we give up replacing it
CHECK_TIMEOUT_S = 120.0    # an in-flight check may wait for a replacement's cold start; a hung host is skipped
RETRY_MAX_S = 1.0


def _exists(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
        return True
    except ValueError:
        return False


@ray.remote(num_cpus=0, max_restarts=-1)
class Directory:
    """Placement, single activation, host incarnations and host death (never Ray's get_if_exists).

    An async actor: every method runs on its one event loop, so the core has a single writer."""

    def __init__(self) -> None:
        self.core = DirectoryCore()
        self._handing_over: asyncio.Task[None] | None = None
        self._joined = asyncio.Event()              # a host registered: orphans may have a place now
        self._tasks: set[asyncio.Task[Any]] = set()

    def _carry_out(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            match effect:
                case StartHost(name=name):
                    if not _exists(name):
                        self._start(effect)
                case ReplaceHost(name=name):
                    self._spawn(self._replace(name))
                case WatchLifeline(name=name, incarnation=incarnation, handle=handle):
                    self._spawn(self._lifeline(name, incarnation, handle))
                case Drain(name=name):
                    self.core.handle(name).drain.remote()
                case Undrain(name=name):
                    self.core.handle(name).undrain.remote()
                case HandOver():
                    if self._handing_over is None or self._handing_over.done():
                        self._handing_over = self._spawn(self._hand_over())
                case Adopt(host=host, conversation_ids=cids):
                    self._spawn(self._adopt(host, list(cids)))
                case Retire(name=name):
                    with contextlib.suppress(ValueError):
                        ray.kill(ray.get_actor(name, namespace=NAMESPACE))
                case RemoveToolPool(generation=generation):
                    with contextlib.suppress(ValueError):
                        ray.kill(ray.get_actor(tool_pool(generation), namespace=NAMESPACE))
                        log.info("generation %s has no host left: its tool pool is gone", generation)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- hosts ---------------------------------------------------------------------------------------

    async def register_host(self, name: str, incarnation: str, handle: Any, fresh: bool = False) -> Registration:
        """A host's start (`fresh`) and its heartbeats."""
        registration, effects = self.core.register(name, incarnation, handle, fresh=fresh)
        self._carry_out(effects)
        self._joined.set()  # a hand-over waiting for a live host looks again (a heartbeat wakes it for nothing)
        return registration

    async def reclaim(self, name: str, incarnation: str, conversation_ids: list[str]) -> list[str]:
        return self.core.reclaim(name, incarnation, conversation_ids)

    async def configure(self, config: RayConfig) -> None:
        self._carry_out(self.core.configure(config))

    async def host_failed(self, name: str, incarnation: str) -> None:
        """A gateway could not reach a host. Believed only once the host does not answer either:
        a false death would hand its live conversations to a second host."""
        if not self.core.is_current(name, incarnation):
            return  # already handled, or a newer incarnation holds the name
        handle = self.core.handle(name)
        if handle is not None:
            try:
                await asyncio.wait_for(handle.identity.remote(), PROBE_TIMEOUT_S)
                return
            except ActorDiedError:
                pass
            except Exception:
                return  # unreachable for now, not known dead: the lifeline decides
        self._carry_out(self.core.died(name, incarnation))

    async def _lifeline(self, name: str, incarnation: str, handle: Any) -> None:
        while self.core.is_current(name, incarnation):
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
        self._carry_out(self.core.died(name, incarnation))

    async def _replace(self, name: str) -> None:
        """Start a new process for a dead sharded host. Its name may stay taken for a moment after
        the death (Ray frees it once the actor is marked dead): retry until free or registered."""
        deadline = time.monotonic() + REPLACE_TIMEOUT_S
        delay = 0.05
        while (start := self.core.replacement(name)) is not None:
            if _exists(name) or self._start(start):
                return  # a replacement exists (ensure_hosts made it) or was made: it registers itself
            if time.monotonic() > deadline:
                log.error("could not replace host %s: its name stayed taken", name)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    def _start(self, start: StartHost) -> bool:
        try:
            handle = ConversationHost.options(  # type: ignore[attr-defined]
                name=start.name, namespace=NAMESPACE, lifetime="detached", num_cpus=start.num_cpus,
                **placement(start.config.actor_resource),
            ).remote(start.name, start.config)
        except ValueError:
            return False  # the name is taken: by a process that just died, or by another creation
        self.core.created(start.name, handle)
        handle.ready.remote()  # open the store and load LiteLLM now, before any conversation needs it
        return True

    async def retire(self, name: str) -> None:
        """A dedicated host whose conversation was passivated, or a drained host of a replaced
        generation: its process goes away (~92 MB)."""
        self._carry_out(self.core.retire(name))

    # -- handing over a dead host's conversations ------------------------------------------------------

    async def _hand_over(self) -> None:
        """Resume now, on live hosts, every orphan with work in flight; leave the idle ones unplaced."""
        delay = 0.05
        while self.core.orphans:
            while (checker := self.core.checker()) is None:
                self._joined.clear()
                await self._joined.wait()
            asked = dict(self.core.orphans)
            try:
                busy = await asyncio.wait_for(self.core.handle(checker).in_flight.remote(list(asked)), CHECK_TIMEOUT_S)
            except Exception as exc:  # that host died too (its lifeline says so), hangs, or its store failed
                log.warning("in-flight check on %s failed (%s): retrying", checker, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = 0.05
            self._carry_out(self.core.handed_over(asked, busy))

    async def _adopt(self, host: str, conversation_ids: list[str]) -> None:
        handle = self.core.handle(host)
        try:
            if handle is not None:
                self.core.adopted(len(await handle.adopt.remote(conversation_ids)))
                return
        except RayActorError:
            pass
        except Exception:
            log.exception("adoption on %s failed", host)
            return
        # Died before activating them. A registered host's lifeline hands them over again (they are
        # assigned to it); one that never registered has no lifeline: hand them over here, after a
        # pause (a dedicated host's dead name may linger a moment).
        if not self.core.has_lifeline(host):
            await asyncio.sleep(RETRY_MAX_S)
            self._carry_out(self.core.vanished(host))

    # -- placement and generations: the core answers ----------------------------------------------------

    async def place(self, conversation_id: str, generation: str | None = None) -> str:
        return self.core.place(conversation_id, generation)

    async def claim(self, conversation_id: str, host: str) -> str:
        return self.core.claim(conversation_id, host)

    async def release(self, conversation_id: str, host: str) -> None:
        self.core.release(conversation_id, host)

    async def hosts(self) -> list[str]:
        return self.core.hosts()

    async def holder(self, conversation_id: str) -> str | None:
        """For operators and tests: the host the conversation is assigned to, if any."""
        return self.core.holder(conversation_id)

    async def handovers(self) -> dict[str, int]:
        """For operators, tests and benches: conversations resumed by a hand-over, and still waiting."""
        return self.core.handovers()

    async def check(self, generation: str, sections: Mapping[str, str] | None = None) -> None:
        self.core.check(generation, sections)

    async def ensure_hosts(self, count: int, config: RayConfig) -> list[str]:
        names, effects = self.core.ensure_hosts(count, config)
        self._carry_out(effects)
        return names

    async def ensure_dedicated(self, conversation_id: str, config: RayConfig) -> str:
        name, effects = self.core.ensure_dedicated(conversation_id, config)
        self._carry_out(effects)
        return name
