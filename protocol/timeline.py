"""The timeline: the conversation's durable record, as ordered blocks (docs/design.md#timeline).

The next decision's context is rendered from it. Dropped material stays dropped: a call that
never ran has no block, and rejected parameters are never echoed — notices carry the diagnosis.
"""

from __future__ import annotations

from typing import Any

import msgspec


class UserMessageBlock(msgspec.Struct, frozen=True, tag="user.message"):
    turn_id: str
    message_id: str
    text: str


class ThinkingBlock(msgspec.Struct, frozen=True, tag="react.thinking"):
    turn_id: str
    round: int
    text: str


class ToolCallBlock(msgspec.Struct, frozen=True, tag="react.tool.call"):
    turn_id: str
    round: int
    call_id: str
    tool_id: str
    params: dict[str, Any]
    code: str | None = None


class ToolResultBlock(msgspec.Struct, frozen=True, tag="react.tool.result"):
    turn_id: str
    call_id: str
    tool_id: str
    ok: bool
    payload: dict[str, Any]        # what the model sees: the result, or {"error": CODE, ...}


class NoticeBlock(msgspec.Struct, frozen=True, tag="react.notice"):
    turn_id: str
    round: int
    notice: dict[str, Any]         # protocol.notices.Notice as a dict


class SteerBlock(msgspec.Struct, frozen=True, tag="react.steer"):
    turn_id: str
    text: str
    interrupted_raw: str           # the one place raw model text returns to a model (docs/design.md#steer)


class SummaryBlock(msgspec.Struct, frozen=True, tag="react.summary"):
    turn_id: str
    text: str


class NativeCall(msgspec.Struct, frozen=True):
    """One function call of a native round, by its action index. `params` is None for a call the
    gates refused or whose arguments were invalid: it is sent back as `{}`, its values never echoed."""

    index: int
    tool_id: str
    params: dict[str, Any] | None = None


class ModelMessageBlock(msgspec.Struct, frozen=True, tag="model.message"):
    """A native round's assistant message, for the provider-shaped history (docs/design.md#native):
    its preamble, every call it made, and the provider's signed thinking blocks as they came."""

    turn_id: str
    round: int
    content: str = ""
    calls: list[NativeCall] = msgspec.field(default_factory=list)
    reasoning: list[dict[str, Any]] = msgspec.field(default_factory=list)


class FinalBlock(msgspec.Struct, frozen=True, tag="assistant.final"):
    turn_id: str
    text: str
    reason: str


Block = (
    UserMessageBlock | ThinkingBlock | ToolCallBlock | ToolResultBlock | NoticeBlock | SteerBlock
    | SummaryBlock | ModelMessageBlock | FinalBlock
)
