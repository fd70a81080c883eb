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
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from actors.catalog import Catalog, Observation, ToolCall
from actors.identity import Caller
from actors.ray.config import RayConfig
from actors.store import store_from_url
from actors.tools.pool import ToolPool

log = logging.getLogger("reactgate.ray.tool_pool")


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

    def stats(self) -> dict[str, Any]:
        stats = self._pool.stats() if self._pool is not None else {"executed": {}, "joined": 0, "inflight": 0}
        return {"pid": os.getpid(), **stats}


class ToolPoolClient:
    """A host's tool executor: every batch goes to the pool actor.

    The pool keeps each conversation's counters and workspace durable itself (it saves them after
    every batch), so the conversation's snapshot carries none of it: `export_conversation` returns
    nothing, and `import_conversation` and `forget` have nothing to do."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

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

    def export_conversation(self, conversation_id: str) -> dict[str, Any]:
        return {}  # the pool's own durable copy is the state; the snapshot carries none

    def import_conversation(self, conversation_id: str, state: Mapping[str, Any]) -> None:
        pass  # nothing to restore: the pool loads its durable copy on the next batch

    def forget(self, conversation_id: str) -> None:
        pass  # the pool keeps serving the conversation wherever it re-activates
