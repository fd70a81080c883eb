"""Durable tool results: a tool call whose result is durable is never executed again
(docs/design.md#tool-pool).

Wraps any executor. Before running a batch it asks the store for results already recorded under
the same call ids (a batch re-submitted after a crash); it runs only the rest, and records each
new result before the turn sees it. Everything else an executor does (the exploration budget,
the per-conversation state a snapshot carries) is the inner executor's, delegated as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from actors.catalog import Catalog, Observation, ToolCall, ToolExecutor
from actors.identity import Caller
from actors.store import Store
from actors.store.outage import retry_unavailable

encode_result = msgspec.json.Encoder().encode   # an Observation as the store keeps it
_decode = msgspec.json.Decoder(Observation).decode


class DurableTools:
    def __init__(self, inner: ToolExecutor, store: Store) -> None:
        self.inner = inner
        self.store = store
        self.executed: dict[str, int] = {}  # calls actually run, per conversation held (not answered from the store)

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: Sequence[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None, caller: Caller | None = None,
    ) -> list[Observation]:
        known: dict[str, Observation] = {}
        for call in calls:
            # A store outage is waited out (docs/design.md#store-outage): both calls are safe to repeat,
            # a result's first write wins and a repeat finds it.
            data = await self._result(conversation_id, call.call_id)
            if data is not None:
                known[call.call_id] = _decode(data)
        todo = [c for c in calls if c.call_id not in known]
        if todo:
            self.executed[conversation_id] = self.executed.get(conversation_id, 0) + len(todo)
            fresh = await self.inner.execute_batch(
                conversation_id, turn_id, todo, exploration_cap=exploration_cap, timeout_s=timeout_s, catalog=catalog, caller=caller
            )
            for obs in fresh:
                if await self._record(conversation_id, obs):
                    known[obs.call_id] = obs
                else:  # another activation recorded it first (or our try whose answer was lost): that one counts
                    stored = await self._result(conversation_id, obs.call_id)
                    known[obs.call_id] = _decode(stored) if stored is not None else obs
        return [known[c.call_id] for c in calls]

    async def recorded(self, conversation_id: str, call_id: str) -> bool:
        """Whether the call's result is durable."""
        return await self._result(conversation_id, call_id) is not None

    async def _result(self, conversation_id: str, call_id: str) -> bytes | None:
        return await retry_unavailable(lambda: self.store.tool_result(conversation_id, call_id))

    async def _record(self, conversation_id: str, obs: Observation) -> bool:
        return await retry_unavailable(lambda: self.store.record_tool_result(conversation_id, obs.call_id, encode_result(obs)))

    # -- the inner executor's, unchanged ----------------------------------------------------------

    async def reset_exploration(self, conversation_id: str) -> None:
        await self.inner.reset_exploration(conversation_id)

    async def cut(self, conversation_id: str, call_ids: Sequence[str]) -> None:
        await self.inner.cut(conversation_id, call_ids)

    def export_conversation(self, conversation_id: str) -> dict[str, Any]:
        return self.inner.export_conversation(conversation_id)

    def import_conversation(self, conversation_id: str, state: Mapping[str, Any]) -> None:
        self.inner.import_conversation(conversation_id, state)

    def forget(self, conversation_id: str) -> None:
        """A passivated or deleted conversation: its count of calls run goes too, so this map holds
        the conversations in use, not every conversation ever served (bench/soak.py)."""
        self.executed.pop(conversation_id, None)
        self.inner.forget(conversation_id)
