"""The ToolPool actor and the client hosts run tools through (docs/design.md#tool-pool).

The actor is a shell around `actors.tools.pool.ToolPool` (durable counters, joining re-submitted
batches, durable results): it adds one named process every host shares, restarted by Ray if it
dies. The client is the hosts' `ToolExecutor`; a pool that dies mid-batch still yields exactly
one observation per call (`tool_pool_unavailable`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.catalog import Catalog, Observation, ToolCall
from actors.identity import Caller
from actors.ray.config import RayConfig
from actors.store import store_from_url
from actors.tools.pool import ToolPool

log = logging.getLogger("reactgate.ray.tool_pool")

# A conversation no batch named for this long (its host's idle_ttl_s, at least this) is dropped from
# the pool's memory even without a `forget`: e.g. its host died while it was idle.
MIN_IDLE_FORGET_S = 60.0


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000)  # type: ignore[call-overload]
class ToolPoolActor:
    """One per cluster (`reactgate-toolpool`): executes tool calls for every host."""

    def __init__(self, config: RayConfig) -> None:
        self._config = config
        self._pool: ToolPool | None = None
        self._opening: asyncio.Lock | None = None

    async def _ready(self) -> ToolPool:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                store = store_from_url(self._config.store_url)
                await store.open()
                self._pool = ToolPool(
                    store, self._config.registry,
                    max_concurrency_per_conversation=self._config.tool_max_concurrency_per_conversation,
                    max_concurrency_global=self._config.tool_max_concurrency_global,
                    idle_forget_s=max(self._config.idle_ttl_s, MIN_IDLE_FORGET_S),
                )
        return self._pool

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: list[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None, caller: Caller | None = None,
    ) -> list[Observation]:
        pool = await self._ready()
        return await pool.execute_batch(
            conversation_id, turn_id, calls, exploration_cap=exploration_cap, timeout_s=timeout_s, catalog=catalog, caller=caller,
        )

    async def reset_exploration(self, conversation_id: str) -> None:
        await (await self._ready()).reset_exploration(conversation_id)

    async def workspace(self, conversation_id: str) -> dict[str, Any]:
        return await (await self._ready()).workspace(conversation_id)

    async def cut(self, conversation_id: str, call_ids: list[str]) -> None:
        if self._pool is not None:  # not open yet: nothing runs here
            await self._pool.cut(conversation_id, call_ids)

    async def forget(self, conversation_id: str) -> None:
        """Its host passivated or deleted the conversation (async: run on the actor's loop, in the
        order the host sent it and its batches)."""
        if self._pool is not None:  # not open yet: it holds nothing
            self._pool.forget(conversation_id)

    def stats(self) -> dict[str, Any]:
        stats = self._pool.stats() if self._pool is not None else {"executed": {}, "joined": 0, "inflight": 0, "cut": 0}
        return {"pid": os.getpid(), **stats}

    def held(self) -> dict[str, int]:
        """The sizes of the pool's per-conversation maps (bench/soak.py samples them)."""
        return {"pid": os.getpid(), **(self._pool.held() if self._pool is not None else {})}


class ToolPoolClient:
    """A host's tool executor: every batch goes to the pool actor.

    The pool keeps each conversation's counters and workspace durable itself (it saves them after
    every batch), so the conversation's snapshot carries none of it: `export_conversation` returns
    nothing and `import_conversation` has nothing to do; `forget` tells the pool the conversation
    left this host (passivated or deleted), so that the pool drops what it holds of it in memory —
    its next batch, wherever it re-activates, loads it again from the store."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._forgetting: set[asyncio.Task[None]] = set()

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: Sequence[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None, caller: Caller | None = None,
    ) -> list[Observation]:
        try:
            return list(await self.pool.execute_batch.remote(
                conversation_id, turn_id, list(calls), exploration_cap=exploration_cap,
                timeout_s=timeout_s, catalog=catalog, caller=caller,
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

    async def cut(self, conversation_id: str, call_ids: Sequence[str]) -> None:
        """A pool that is down runs nothing of them; one that misses this still answers a retry from
        the recorded result rather than join the run (actors/tools/pool.py)."""
        try:
            await self.pool.cut.remote(conversation_id, list(call_ids))
        except (RayActorError, RayTaskError) as exc:
            log.warning("cutting %d call(s) of %s at the tool pool failed: %s", len(call_ids), conversation_id,
                        type(exc).__name__)

    def export_conversation(self, conversation_id: str) -> dict[str, Any]:
        return {}  # the pool's own durable copy is the state; the snapshot carries none

    def import_conversation(self, conversation_id: str, state: Mapping[str, Any]) -> None:
        pass  # nothing to restore: the pool loads its durable copy on the next batch

    def forget(self, conversation_id: str) -> None:
        """Sent, not awaited (the host calls it from passivation and deletion): a pool that is down
        loses nothing by missing it — it holds nothing once restarted, and drops idle entries itself."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: no host running here
        try:  # submitted now, so that it reaches the pool before any later batch of this host
            sent = self.pool.forget.remote(conversation_id)
        except Exception as exc:  # never fails a passivation or a delete
            log.debug("forgetting %s at the tool pool failed: %s", conversation_id, type(exc).__name__)
            return
        task = loop.create_task(self._forget(conversation_id, sent))
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    @staticmethod
    async def _forget(conversation_id: str, sent: Awaitable[None]) -> None:
        try:
            await sent
        except Exception as exc:  # the pool died or restarted: nothing of the conversation is left there
            log.debug("forgetting %s at the tool pool failed: %s", conversation_id, type(exc).__name__)
