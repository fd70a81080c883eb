"""The tool pool: one tool executor shared by every host of a cluster (docs/design.md#tool-pool).

The plain class the ToolPool Ray actor (`actors/ray/tool_pool.py`) wraps; tests construct it
without Ray. It runs batches through `LocalToolExecutor` behind `DurableTools` (a call whose
result is durable is never executed again) and adds what a pool shared by many hosts, and
restarted on its own, needs:
- each conversation's exploration counter and workspace are durable in the store (saved after
  every batch and every reset, loaded on first use), so a restarted pool resumes them — they do
  not travel in the conversation's snapshot as they do with the local backend;
- a batch re-submitted after its host crashed joins the calls of that batch still in flight here,
  so each call runs once, and both callers get the same observation — but an external call the
  crash cut is over (docs/design.md#mcp-face): its run here is cancelled (`cut`), and a retry of it
  gets the `round_interrupted` recorded as its result, never a run still going;
- what it holds of a conversation in memory goes when the conversation is passivated or deleted
  (`forget`, which its host sends), or when no batch named it for `idle_forget_s` (a conversation
  whose host died idle is never passivated by it): the pool holds the conversations in use, not
  every conversation it ever served. Nothing durable is lost — the counter and workspace were saved
  after the conversation's last batch or reset, and its next batch loads them again (bench/soak.py
  measured the maps growing with every conversation served before).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from actors.catalog import Catalog, Observation, ToolCall
from actors.identity import Caller
from actors.store import Store
from actors.store.base import TOOL_POOL_SCOPE
from actors.tools.durable import DurableTools
from actors.tools.executor import LocalToolExecutor
from actors.tools.registry import Clock, ToolRegistry

# The pool's snapshots share the store with conversations' snapshots, under a scope the store deletes
# with the conversation (docs/design.md#deletion).
STATE_KEY_PREFIX = TOOL_POOL_SCOPE


def state_key(conversation_id: str) -> str:
    return f"{STATE_KEY_PREFIX}{conversation_id}"


@dataclass(frozen=True, slots=True)
class _Run:
    """A batch running here: the task that runs it, and the ids of its calls."""

    task: asyncio.Task[Any]
    calls: frozenset[str]


class ToolPool:
    def __init__(
        self,
        store: Store,
        registry: ToolRegistry,
        *,
        max_concurrency_per_conversation: int = 4,
        max_concurrency_global: int = 64,
        clock: Clock | None = None,
        idle_forget_s: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._executor = LocalToolExecutor(
            registry,
            max_concurrency_per_conversation=max_concurrency_per_conversation,
            max_concurrency_global=max_concurrency_global,
            clock=clock,
        )
        self._durable = DurableTools(self._executor, store)
        self._loading: dict[str, asyncio.Future[None]] = {}   # one load per conversation, shared
        self._versions: dict[str, int] = {}
        self._inflight: dict[tuple[str, str], asyncio.Future[Observation]] = {}
        self._runs: dict[tuple[str, str], _Run] = {}   # by (conversation, call): what runs it
        self._joined = 0  # calls answered by a run already in flight, not run again
        self._cut = 0     # batches of cut external calls cancelled
        # Memory bounded by the conversations in use (see `forget`): batches and resets running per
        # conversation, forgets that wait for them, and when each conversation was last used.
        self._busy: dict[str, int] = {}
        self._forget_when_done: set[str] = set()
        self._last_used: dict[str, float] = {}
        self._idle_forget_s = idle_forget_s
        self._monotonic = monotonic
        self._next_sweep = monotonic() + (idle_forget_s or 0.0)

    # -- what it holds in memory, per conversation -------------------------------------------------

    def forget(self, conversation_id: str) -> None:
        """The conversation was passivated or deleted: drop its counter, workspace, version and
        execution count from memory. Its counter and workspace are durable (saved after every batch
        and reset), and its next batch, on whichever host activates it, loads them again. While a
        batch or reset of it runs here, they go once the last one ends."""
        if self._busy.get(conversation_id):
            self._forget_when_done.add(conversation_id)
        else:
            self._drop(conversation_id)

    def _drop(self, conversation_id: str) -> None:
        self._forget_when_done.discard(conversation_id)
        self._last_used.pop(conversation_id, None)
        self._loading.pop(conversation_id, None)
        self._versions.pop(conversation_id, None)
        self._durable.forget(conversation_id)

    @contextmanager
    def _using(self, conversation_id: str) -> Iterator[None]:
        """Marks a batch or reset of the conversation as running: nothing of it is dropped meanwhile.
        Entered before the first await, so a `forget` that arrives after the call sees it."""
        self._sweep()
        self._busy[conversation_id] = self._busy.get(conversation_id, 0) + 1
        try:
            yield
        finally:
            left = self._busy[conversation_id] - 1
            if left:
                self._busy[conversation_id] = left
            else:
                del self._busy[conversation_id]
                self._last_used[conversation_id] = self._monotonic()
                if conversation_id in self._forget_when_done:
                    self._drop(conversation_id)

    def _sweep(self) -> None:
        """Drop the conversations no batch named for `idle_forget_s` (none running): those whose
        host died while they were idle, or whose `forget` was lost with a process. At most every
        quarter of `idle_forget_s`."""
        if self._idle_forget_s is None:
            return
        now = self._monotonic()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self._idle_forget_s / 4
        stale = [cid for cid, used in self._last_used.items()
                 if now - used >= self._idle_forget_s and not self._busy.get(cid)]
        for cid in stale:
            self._drop(cid)

    def held(self) -> dict[str, int]:
        """How many conversations each per-conversation map holds (for tests and bench/soak.py)."""
        executor = self._executor
        return {
            "exploration counters": len(executor._exploration),
            "workspaces": len(executor._workspaces),
            "versions": len(self._versions),
            "loads": len(self._loading),
            "executed counts": len(self._durable.executed),
            "last used": len(self._last_used),
            "busy": len(self._busy),
            "inflight calls": len(self._inflight),
        }

    # -- durable counters ------------------------------------------------------------------------

    async def _load(self, conversation_id: str) -> None:
        """Counters are durable: a new pool over the same store picks them up where they were
        (docs/design.md#exploration-budget). Concurrent first batches share one load, so a late
        load never overwrites a counter an earlier batch already moved."""
        loading = self._loading.get(conversation_id)
        if loading is not None:
            return await asyncio.shield(loading)
        loading = self._loading[conversation_id] = asyncio.get_running_loop().create_future()
        try:
            snap = await self._store.load_snapshot(state_key(conversation_id))
            if snap is not None:
                self._versions[conversation_id] = snap[0]
                self._executor.import_conversation(conversation_id, json.loads(snap[1]))
        except BaseException as exc:
            del self._loading[conversation_id]  # the next batch tries again
            loading.set_exception(exc if isinstance(exc, Exception) else RuntimeError("load cancelled"))
            loading.exception()  # retrieved: waiters re-raise it
            raise
        loading.set_result(None)

    async def _save(self, conversation_id: str) -> None:
        version = self._versions.get(conversation_id, 0) + 1
        self._versions[conversation_id] = version
        data = json.dumps(self._executor.export_conversation(conversation_id)).encode()
        await self._store.save_snapshot(state_key(conversation_id), version, data)

    # -- what hosts call -------------------------------------------------------------------------

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: Sequence[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None, caller: Caller | None = None,
    ) -> list[Observation]:
        with self._using(conversation_id):
            return await self._execute_batch(
                conversation_id, turn_id, calls, exploration_cap=exploration_cap, timeout_s=timeout_s,
                catalog=catalog, caller=caller)

    async def _execute_batch(
        self, conversation_id: str, turn_id: str, calls: Sequence[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None, caller: Caller | None,
    ) -> list[Observation]:
        await self._load(conversation_id)
        # A batch re-submitted after a host crash joins the calls still in flight here; not a call
        # whose result is recorded already (a cut external call's `round_interrupted`, `cut`): it is
        # over, and the durable results below answer it.
        joined = {c.call_id: self._inflight[(conversation_id, c.call_id)]
                  for c in calls if (conversation_id, c.call_id) in self._inflight}
        for call_id in list(joined):
            if await self._durable.recorded(conversation_id, call_id):
                del joined[call_id]
        fresh = [c for c in calls if c.call_id not in joined]
        self._joined += len(joined)
        loop = asyncio.get_running_loop()
        mine: dict[str, asyncio.Future[Observation]] = {c.call_id: loop.create_future() for c in fresh}
        task = asyncio.current_task()
        assert task is not None
        run = _Run(task, frozenset(mine))
        for call_id, fut in mine.items():
            self._inflight[(conversation_id, call_id)] = fut
            self._runs[(conversation_id, call_id)] = run
        try:
            if fresh:
                results = await self._durable.execute_batch(
                    conversation_id, turn_id, fresh, exploration_cap=exploration_cap,
                    timeout_s=timeout_s, catalog=catalog, caller=caller,
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
            for call_id, fut in mine.items():   # unless a later batch of the call took its place
                if self._inflight.get((conversation_id, call_id)) is fut:
                    del self._inflight[(conversation_id, call_id)]
                if self._runs.get((conversation_id, call_id)) is run:
                    del self._runs[(conversation_id, call_id)]

    async def cut(self, conversation_id: str, call_ids: Sequence[str]) -> None:
        """External calls a host crash cut (docs/design.md#mcp-face): their conversation's next
        activation recorded `round_interrupted` as their result, while the batch the dead host sent
        may still run here — the pool outlives hosts. Such a batch is cancelled when every call of it
        is cut (an external call comes alone in its batch; a model round's calls are never cut, they
        are joined). Its result would lose to the recorded one anyway."""
        cut = set(call_ids)
        runs = {run.task: run for call_id in cut if (run := self._runs.get((conversation_id, call_id))) is not None}
        cancelled = [run for run in runs.values() if run.calls <= cut and run.task.cancel()]
        self._cut += len(cancelled)

    async def reset_exploration(self, conversation_id: str) -> None:
        with self._using(conversation_id):
            await self._load(conversation_id)
            await self._executor.reset_exploration(conversation_id)
            await self._save(conversation_id)

    async def workspace(self, conversation_id: str) -> dict[str, Any]:
        """The conversation's counter and workspace as the pool holds them (for operators and tests)."""
        with self._using(conversation_id):
            await self._load(conversation_id)
            return self._executor.export_conversation(conversation_id)

    def stats(self) -> dict[str, Any]:
        """Calls actually executed per conversation held now (never those answered from the store;
        a forgotten conversation's count goes with it), calls that joined a run in flight, and how
        many calls are running now."""
        return {"executed": dict(self._durable.executed), "joined": self._joined, "inflight": len(self._inflight),
                "cut": self._cut}
