"""What the runtime knows about a tool without running it (docs/design.md#traits, #states).

The round's gates decide from these declarations alone; the tool registry builds them from
each tool's own definition, and an agent profile may override a trait per connection. A turn
runs tools only through a `ToolExecutor`: in-process, or the tool pool over Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from actors.identity import Caller


class Trait(StrEnum):
    EXPLORATION = "exploration"    # fetches data a later step reads
    EXPLOITATION = "exploitation"  # consumes data already visible
    NEUTRAL = "neutral"            # neither
    UNKNOWN = "unknown"            # declared nothing: compatible with nothing


class Safety(StrEnum):
    SAFE = "safe"
    WRITE = "write"                # absent in ask mode (docs/design.md#ask-mode)


ASK_USER_TOOL = "react.ask_user"


def spend_exploration(used: int, cap: int) -> int | None:
    """The exploration budget's count after one more exploration call, or None when the call is
    over the cap: it is not executed and does not count (docs/design.md#exploration-budget). The
    tool pool keeps the authoritative count; replay counts the same way."""
    return used + 1 if used < cap else None


@dataclass(frozen=True, slots=True)
class ToolDecl:
    tool_id: str
    trait: Trait = Trait.UNKNOWN
    safety: Safety = Safety.SAFE
    uses_code: bool = False
    transitions_state: bool = False
    confirm: bool = False                 # a call runs only once the user approves it (docs/design.md#execute-confirmation)
    states: frozenset[str] | None = None  # None: available in every state
    description: str = ""
    params_schema: Mapping[str, Any] = field(default_factory=dict)

    def available_in(self, state: str) -> bool:
        return self.states is None or state in self.states


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An accepted, schema-valid call_tool action, ready to execute."""

    call_id: str
    tool_id: str
    params: Mapping[str, Any]
    code: str | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """What the world said about one call. Every call gets exactly one (docs/design.md#observations)."""

    call_id: str
    tool_id: str
    ok: bool
    result: Mapping[str, Any] | None = None   # when ok
    error: str | None = None                  # error code when not ok, e.g. "timeout"
    detail: Mapping[str, Any] = field(default_factory=dict)  # extra fields of the error payload
    duration_ms: int = 0
    ui_commands: tuple[Mapping[str, Any], ...] = ()

    def payload(self) -> dict[str, Any]:
        """The JSON the model sees as this call's observation."""
        if self.ok:
            return dict(self.result or {})
        return {"error": self.error, **self.detail}


class Catalog:
    """The tools one conversation may know of, after its profile's overrides."""

    def __init__(self, decls: Iterable[ToolDecl]) -> None:
        self._decls = {d.tool_id: d for d in decls}

    def get(self, tool_id: str) -> ToolDecl | None:
        return self._decls.get(tool_id)

    def __contains__(self, tool_id: object) -> bool:
        return tool_id in self._decls

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._decls.values())

    def with_overrides(
        self,
        traits: Mapping[str, Trait] | None = None,
        states: Mapping[str, frozenset[str] | None] | None = None,
        confirm: Mapping[str, bool] | None = None,
    ) -> Catalog:
        decls = dict(self._decls)
        for tool_id, trait in (traits or {}).items():
            decls[tool_id] = replace(decls[tool_id], trait=trait)
        for tool_id, st in (states or {}).items():
            decls[tool_id] = replace(decls[tool_id], states=st)
        for tool_id, needed in (confirm or {}).items():
            if tool_id in decls:
                decls[tool_id] = replace(decls[tool_id], confirm=needed)
        return Catalog(decls.values())

    def restricted_to(self, tool_ids: Iterable[str]) -> Catalog:
        keep = set(tool_ids)
        return Catalog(d for d in self._decls.values() if d.tool_id in keep)


class ToolExecutor(Protocol):
    """Runs a batch of accepted calls; every call gets exactly one observation, in call order.

    An executor also holds per-conversation state (exploration counter, workspace). Where that
    state lives decides the last three methods: an in-process executor hands it to the
    conversation's snapshot (`export_conversation`), takes it back on re-activation
    (`import_conversation`) and drops it on passivation (`forget`); an executor that keeps its own
    durable copy (the Ray tool pool) exports nothing and ignores the other two."""

    async def execute_batch(
        self, conversation_id: str, turn_id: str, calls: Sequence[ToolCall], *,
        exploration_cap: int, timeout_s: float, catalog: Catalog | None = None, caller: Caller | None = None,
    ) -> list[Observation]: ...

    async def reset_exploration(self, conversation_id: str) -> None: ...

    async def cut(self, conversation_id: str, call_ids: Sequence[str]) -> None:
        """External calls a crash cut, whose `round_interrupted` their conversation's next activation
        recorded as their result (docs/design.md#mcp-face): stop any run of them still going. Only an
        executor that outlives a host (the Ray tool pool) can hold one."""
        ...

    def export_conversation(self, conversation_id: str) -> dict[str, Any]:
        """The conversation's executor state as plain data, for its snapshot."""
        ...

    def import_conversation(self, conversation_id: str, state: Mapping[str, Any]) -> None:
        """Restore what `export_conversation` returned, on re-activation."""
        ...

    def forget(self, conversation_id: str) -> None:
        """Drop a passivated conversation's state from memory."""
        ...
