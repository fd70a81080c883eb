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


class FinalBlock(msgspec.Struct, frozen=True, tag="assistant.final"):
    turn_id: str
    text: str
    reason: str


Block = (
    UserMessageBlock | ThinkingBlock | ToolCallBlock | ToolResultBlock | NoticeBlock | SteerBlock
    | SummaryBlock | FinalBlock
)
