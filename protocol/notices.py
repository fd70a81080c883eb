"""Notices: self-sufficient corrective feedback for the model (docs/design.md#notices).

A notice carries its whole diagnosis inline — code, message, and where it applies the action
index, tool id and violations — because the raw generation is not returned to the model.
Messages state recorded facts only (guarantee 4: the model is never lied to).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import msgspec


class NoticeCode(StrEnum):
    PREAMBLE = "protocol_violation.preamble"
    TOOL_CALL_INVALID = "protocol_violation.tool_call_invalid"
    SCHEMA = "protocol_violation.schema"
    CHANNELS = "protocol_violation.channels"
    TOO_MANY_ACTIONS = "protocol_violation.too_many_actions"
    INCOMPATIBLE_TRAITS = "multi_action.incompatible_traits"
    ANSWER_LANE_DENIED = "multi_action.answer_lane_denied"
    AFTER_FINAL = "multi_action.after_final"
    FINISH_ILLEGAL = "finish.illegal"
    TOOL_UNAVAILABLE = "tool_unavailable"
    ASK_MODE_DENIED = "ASK_MODE_DENIED"
    CONFIRMATION_REQUIRED = "exploration_budget.confirmation_required"
    OUTPUT_TRUNCATED = "output_truncated"
    PROVIDER_ERROR = "provider_error"
    ROUND_INTERRUPTED = "round_interrupted"


class Notice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    code: NoticeCode
    message: str
    index: int | None = None
    tool_id: str | None = None
    violations: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]
