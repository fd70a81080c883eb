"""The in-process tool executor (docs/design.md#observations, #exploration-budget, #tool-pool).

The local backend runs it behind `DurableTools`; on Ray the tool pool (`actors/tools/pool.py`)
does, inside its actor.

Its one promise: every call in a batch gets exactly one Observation, in the order of the calls.
Whatever stops a call — unknown tool, invalid params, an incompatible batch, the exploration
budget, a timeout, an exception — becomes an error observation, never a missing one. The only
thing that escapes is cancellation, which the turn uses to steer (docs/design.md#steer).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from actors.catalog import Catalog, Observation, ToolCall, ToolDecl, Trait, spend_exploration
from actors.gates import traits_compatible
from actors.identity import Caller
from actors.tools.registry import Clock, ToolContext, ToolRegistry, utc_now

MAX_ERROR_MESSAGE = 500


class LocalToolExecutor:
    def __init__(
        self,
        registry: ToolRegistry,
        *,
        max_concurrency_per_conversation: int = 4,
        max_concurrency_global: int = 64,
        clock: Clock | None = None,
    ) -> None:
        self._registry = registry
        self._clock = clock or utc_now
        self._per_conversation_limit = max_concurrency_per_conversation
        self._global = asyncio.Semaphore(max_concurrency_global)
        self._conversation_slots: dict[str, _Slots] = {}
        # The authoritative exploration counters (docs/design.md#exploration-budget) and workspaces,
        # per conversation.
        self._exploration: dict[str, int] = {}
        self._workspaces: dict[str, dict[str, Any]] = {}

    # --- the batch ---------------------------------------------------------------------------

    async def execute_batch(
        self,
        conversation_id: str,
        turn_id: str,
        calls: Sequence[ToolCall],
        *,
        exploration_cap: int,
        timeout_s: float,
        catalog: Catalog | None = None,
        caller: Caller | None = None,
    ) -> list[Observation]:
        if catalog is None:
            catalog = self._registry.catalog()
        # Admission is synchronous (no await), so the budget and trait checks of one batch see a
        # consistent counter even when batches of one conversation overlap.
        accepted: list[ToolDecl] = []
        verdicts = [
            self._admit(conversation_id, call, catalog, accepted, exploration_cap) for call in calls
        ]
        runs = [
            self._run(conversation_id, turn_id, call, params, timeout_s, caller)
            for call, params in zip(calls, verdicts, strict=True)
            if isinstance(params, BaseModel)
        ]
        results = iter(await asyncio.gather(*runs))
        return [v if isinstance(v, Observation) else next(results) for v in verdicts]

    def _admit(
        self,
        conversation_id: str,
        call: ToolCall,
        catalog: Catalog,
        accepted: list[ToolDecl],
        exploration_cap: int,
    ) -> Observation | BaseModel:
        """The refusal of a call, or its validated params when it may run."""
        decl = catalog.get(call.tool_id)
        if decl is None or call.tool_id not in self._registry:
            return _refuse(call, "unknown_tool", message="no such tool in this conversation")
        params, violations = self._registry.validate_params(call.tool_id, call.params)
        if params is None:
            return _refuse(call, "invalid_params", violations=violations)
        # Defense in depth: the gates already checked this batch (docs/design.md#gates). A call is
        # checked against every call of the batch that will run.
        for prior in accepted:
            if not traits_compatible(prior.trait, decl.trait):
                return _refuse(
                    call,
                    "incompatible_batch",
                    message=f"{decl.tool_id} ({decl.trait}) cannot run in one batch "
                    f"with {prior.tool_id} ({prior.trait})",
                )
        if decl.trait is Trait.EXPLORATION:
            # docs/design.md#exploration-budget: a call over the cap is not executed and does not count.
            spent = spend_exploration(self._exploration.get(conversation_id, 0), exploration_cap)
            if spent is None:
                return _refuse(call, "EXPLORATION_BUDGET_REACHED", cap=exploration_cap)
            self._exploration[conversation_id] = spent
        accepted.append(decl)
        return params

    async def _run(
        self,
        conversation_id: str,
        turn_id: str,
        call: ToolCall,
        params: BaseModel,
        timeout_s: float,
        caller: Caller | None = None,
    ) -> Observation:
        tool = self._registry.get(call.tool_id)
        assert tool is not None  # admitted calls name registered tools
        ctx = ToolContext(
            conversation_id=conversation_id,
            turn_id=turn_id,
            call_id=call.call_id,
            code=call.code,
            workspace=self._workspaces.setdefault(conversation_id, {}),
            clock=self._clock,
            caller=caller,
        )
        # Per-conversation slot first, then a global one: a conversation queued behind its own
        # cap holds no global slot. The timeout covers the handler, not the queue.
        async with self._slots(conversation_id), self._global:
            started = time.perf_counter()
            try:
                async with asyncio.timeout(timeout_s) as deadline:
                    result = await tool.handler(params, ctx)
            except TimeoutError as exc:
                if not deadline.expired():  # the handler's own TimeoutError, not our deadline
                    return _failed(call, started, _tool_error(exc))
                return _failed(call, started, ("timeout", {"timeout_s": timeout_s}))
            except Exception as exc:  # a tool's failure is an observation (docs/design.md#observations)
                return _failed(call, started, _tool_error(exc))
        return _succeeded(call, started, result)

    # --- exploration budget and state --------------------------------------------------------

    async def reset_exploration(self, conversation_id: str) -> None:
        self._exploration.pop(conversation_id, None)

    async def cut(self, conversation_id: str, call_ids: Sequence[str]) -> None:
        """Nothing to stop: in-process runs end with the host that made them (a crash, or the
        deactivation that cancels the conversation's turn and calls)."""

    def exploration_count(self, conversation_id: str) -> int:
        return self._exploration.get(conversation_id, 0)

    def export_conversation(self, conversation_id: str) -> dict[str, Any]:
        """One conversation's counters and workspace as plain data, for its snapshot: exploration
        counters are durable with the conversation (docs/design.md#exploration-budget: counted
        authoritatively)."""
        return {
            "exploration": self._exploration.get(conversation_id, 0),
            "workspace": copy.deepcopy(self._workspaces.get(conversation_id, {})),
        }

    def import_conversation(self, conversation_id: str, state: Mapping[str, Any]) -> None:
        self._exploration[conversation_id] = int(state.get("exploration", 0))
        self._workspaces[conversation_id] = copy.deepcopy(dict(state.get("workspace", {})))

    def forget(self, conversation_id: str) -> None:
        """Drop a passivated conversation's state from memory (its snapshot holds it)."""
        self._exploration.pop(conversation_id, None)
        self._workspaces.pop(conversation_id, None)

    def _slots(self, conversation_id: str) -> _Slots:
        slots = self._conversation_slots.get(conversation_id)
        if slots is None:
            slots = _Slots(self._per_conversation_limit, self._conversation_slots, conversation_id)
            self._conversation_slots[conversation_id] = slots
        return slots


class _Slots:
    """A conversation's semaphore that removes itself from the pool's map once idle."""

    def __init__(self, limit: int, owner: dict[str, _Slots], key: str) -> None:
        self._semaphore = asyncio.Semaphore(limit)
        self._owner, self._key = owner, key
        self._users = 0

    async def __aenter__(self) -> None:
        self._users += 1
        try:
            await self._semaphore.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._semaphore.release()
        self._leave()

    def _leave(self) -> None:
        self._users -= 1
        if self._users == 0 and self._owner.get(self._key) is self:
            del self._owner[self._key]


# --- observations ----------------------------------------------------------------------------


def _refuse(call: ToolCall, error: str, **detail: Any) -> Observation:
    return Observation(call.call_id, call.tool_id, ok=False, error=error, detail=detail)


def _tool_error(exc: BaseException) -> tuple[str, dict[str, Any]]:
    return "tool_error", {"message": str(exc)[:MAX_ERROR_MESSAGE], "exception": type(exc).__name__}


def _failed(call: ToolCall, started: float, error: tuple[str, dict[str, Any]]) -> Observation:
    code, detail = error
    return Observation(
        call.call_id, call.tool_id, ok=False, error=code, detail=detail, duration_ms=_ms(started)
    )


def _succeeded(call: ToolCall, started: float, result: Any) -> Observation:
    duration_ms = _ms(started)
    if not isinstance(result, dict):
        problem = TypeError(f"handler returned {type(result).__name__}, not a JSON object")
        return _failed(call, started, _tool_error(problem))
    result = dict(result)
    commands = result.pop("ui_commands", None) or []
    # docs/design.md#ui-commands: each ui_command becomes its own event, so each must be a
    # {"command": ...} object.
    if not isinstance(commands, list) or not all(
        isinstance(c, dict) and isinstance(c.get("command"), str) for c in commands
    ):
        problem = TypeError("ui_commands must be a list of {'command': str, 'args': {...}} objects")
        return _failed(call, started, _tool_error(problem))
    return Observation(
        call.call_id,
        call.tool_id,
        ok=True,
        result=result,
        duration_ms=duration_ms,
        ui_commands=tuple(commands),
    )


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)
