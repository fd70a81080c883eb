"""The action schema and its incremental decoder (SPEC §2).

One `ActionDecoder` per action block reads the block's text — an optional Markdown fence around
one JSON object — and reports, as soon as they are determined, the action type, the tool id and
the JSON-unescaped `final_answer` characters, whatever the key order. When the block closes, the
post-stream check reads `result()` of the same decoder: there is no second parse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from protocol.jsonstream import JsonStream, Path


class ActionType(StrEnum):
    CALL_TOOL = "call_tool"
    COMPLETE = "complete"
    EXIT = "exit"

    @property
    def is_final(self) -> bool:
        return self is not ActionType.CALL_TOOL


@dataclass(frozen=True, slots=True)
class CallTool:
    tool_id: str
    params: Mapping[str, Any] = field(default_factory=dict)
    type: ActionType = ActionType.CALL_TOOL


@dataclass(frozen=True, slots=True)
class Finish:
    """`complete` or `exit`: the turn's final answer."""

    type: ActionType
    final_answer: str
    reason: str | None = None


Action = CallTool | Finish

# The schema, as data: which keys each action may carry. A `final_answer` on call_tool is
# tolerated and ignored — never shown, and the tool still runs.
ALLOWED_KEYS: Final[Mapping[ActionType, frozenset[str]]] = {
    ActionType.CALL_TOOL: frozenset({"action", "tool_call", "final_answer"}),
    ActionType.COMPLETE: frozenset({"action", "final_answer"}),
    ActionType.EXIT: frozenset({"action", "final_answer", "reason"}),
}
TOOL_CALL_KEYS: Final = frozenset({"tool_id", "params"})

# Accepted fence habits: ``` ```json ```JSON, newline after the opener or not, any whitespace.
FENCE_LANGS: Final = frozenset({"", "json", "JSON"})

_ACTION_TYPES: Final = {t.value: t for t in ActionType}
_WS = re.compile(r"[ \t\n\r]*")
_LANG = re.compile(r"[A-Za-z]*")

# Decoder phases.
_LEAD, _FENCE_OPEN, _FENCE_LANG, _AFTER_FENCE, _JSON, _TRAIL, _FENCE_CLOSE, _DONE, _ERROR = range(9)


def validate_action(obj: Any) -> tuple[Action | None, list[str]]:
    """Check one decoded action object against the schema. Violations name keys, never values
    (rejected parameters are not echoed back to the model, SPEC §3.6)."""
    if not isinstance(obj, dict):
        return None, ["the action must be a JSON object"]
    raw_type = obj.get("action")
    atype = _ACTION_TYPES.get(raw_type) if isinstance(raw_type, str) else None
    if atype is None:
        allowed = ", ".join(t.value for t in ActionType)
        if "action" not in obj:
            return None, [f"missing key 'action' (one of: {allowed})"]
        return None, [f"'action' must be one of: {allowed}"]
    violations = [f"unknown key {k!r}" for k in obj if k not in ALLOWED_KEYS[atype]]
    if atype is ActionType.CALL_TOOL:
        call = obj.get("tool_call")
        if not isinstance(call, dict):
            violations.append("'tool_call' must be an object with 'tool_id' and 'params'")
            return None, violations
        violations += [f"unknown key 'tool_call.{k}'" for k in call if k not in TOOL_CALL_KEYS]
        tool_id, params = call.get("tool_id"), call.get("params", {})
        if not isinstance(tool_id, str) or not tool_id:
            violations.append("'tool_call.tool_id' must be a non-empty string")
        if not isinstance(params, dict):
            violations.append("'tool_call.params' must be an object")
        if violations:
            return None, violations
        assert isinstance(tool_id, str)
        return CallTool(tool_id=tool_id, params=params), []
    answer, reason = obj.get("final_answer"), obj.get("reason")
    if not isinstance(answer, str):
        violations.append("'final_answer' must be a string" if "final_answer" in obj else "missing key 'final_answer'")
    if reason is not None and not isinstance(reason, str):
        violations.append("'reason' must be a string")
    if violations:
        return None, violations
    return Finish(type=atype, final_answer=answer, reason=reason), []  # type: ignore[arg-type]


class ActionDecoder:
    """Decodes one action block incrementally; see the module docstring."""

    __slots__ = (
        "_answer",
        "_fenced",
        "_json",
        "_lang",
        "_phase",
        "_ticks",
        "action_type",
        "announced",
        "answer_chars",
        "error",
        "tool_id",
        "typed",
    )

    def __init__(self) -> None:
        self._phase = _LEAD
        self._fenced = False
        self._ticks = 0
        self._lang = ""
        self._json = JsonStream(on_chars=self._on_chars, on_value=self._on_value)
        self._answer: list[str] = []
        self.action_type: ActionType | None = None
        self.tool_id: str | None = None
        self.typed = False            # action type (and tool id for call_tool) determined
        self.announced = False        # the channel parser has reported `typed`
        self.answer_chars: list[str] = []  # decoded final_answer chars not yet collected by the parser
        self.error: str | None = None

    # -- live view ------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self._phase == _ERROR

    @property
    def in_string(self) -> bool:
        """Inside a JSON string a tag-like `<` is text, not structure (SPEC §2)."""
        return self._phase == _JSON and self._json.in_string

    def answer_so_far(self) -> str:
        return "".join(self._answer)

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, text: str, pos: int = 0) -> int:
        """Consume text[pos:]; stop at a `<` outside any JSON string and return its index
        (the channel parser decides whether it starts the closing tag), else return len(text)."""
        n = len(text)
        while pos < n:
            phase = self._phase
            if phase == _ERROR:
                return pos
            if phase == _JSON:
                pos = self._json.feed(text, pos, stop_at="<")
                if self._json.failed:
                    self._fail(f"invalid JSON: {self._json.error}")
                elif self._json.done:
                    self._phase = _TRAIL
                    continue
                return pos
            if phase == _FENCE_OPEN:
                pos = self._count_ticks(text, pos, then=_FENCE_LANG)
                continue
            if phase == _FENCE_CLOSE:
                pos = self._count_ticks(text, pos, then=_DONE)
                continue
            if phase == _FENCE_LANG:
                end = _LANG.match(text, pos).end()  # type: ignore[union-attr]
                if end > pos:
                    self._lang += text[pos:end]
                    pos = end
                    if len(self._lang) > 4:
                        self._fail("unsupported fence language (accepted: ```, ```json, ```JSON)")
                    continue
                if self._lang not in FENCE_LANGS:
                    self._fail("unsupported fence language (accepted: ```, ```json, ```JSON)")
                    return pos
                self._phase = _AFTER_FENCE
                continue  # `{` may follow the language on the same line
            ch = text[pos]
            if ch in " \t\n\r":
                pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
                continue
            if ch == "<":
                return pos
            if phase == _LEAD and ch == "`":
                self._phase, self._fenced, self._ticks = _FENCE_OPEN, True, 0
            elif phase in (_LEAD, _AFTER_FENCE) and ch == "{":
                self._phase = _JSON
            elif phase == _TRAIL and ch == "`" and self._fenced:
                self._phase, self._ticks = _FENCE_CLOSE, 0
            elif phase in (_TRAIL, _DONE):
                self._fail("unexpected text after the action JSON")
            else:
                self._fail("expected a JSON object, bare or in a ``` fence")
        return pos

    def reject(self, what: str) -> None:
        """The parser met `what` (a `<` that does not start the closing tag) where we stopped."""
        if self._phase == _JSON:
            self._fail("invalid JSON: unexpected '<'")
        else:
            self._fail(f"unexpected {what!r} in the action block")

    def finish(self) -> None:
        """The block closed (or the stream ended)."""
        if self._phase == _JSON:
            self._json.finish()
            self._fail(f"invalid JSON: {self._json.error}")
        elif self._phase in (_LEAD, _FENCE_OPEN, _FENCE_LANG, _AFTER_FENCE):
            self._fail("the action block holds no JSON object")
        elif self._phase == _FENCE_CLOSE and self._ticks == 3:
            self._phase = _DONE  # the closing fence was the last thing in the block
        elif self._phase == _FENCE_CLOSE or (self._phase == _TRAIL and self._fenced):
            self._fail("the ``` fence is not closed")

    def result(self) -> tuple[Action | None, list[str]]:
        """The post-stream verdict, read from this decoder's own final state."""
        if self.error is not None:
            return None, [self.error]
        if self._phase not in (_TRAIL, _DONE):
            return None, ["the action JSON is incomplete"]
        return validate_action(self._json.value)

    # -- internals --------------------------------------------------------------------------

    def _count_ticks(self, text: str, pos: int, then: int) -> int:
        n = len(text)
        while pos < n and text[pos] == "`":
            self._ticks += 1
            pos += 1
        # The run ends only at a non-tick character: a fourth tick may still come in the next
        # delta, and the verdict must not depend on where the deltas were cut (SPEC §2).
        if self._ticks > 3:
            self._fail("a fence is exactly three backticks")
        elif pos < n:
            if self._ticks == 3:
                self._phase = then
            else:
                self._fail("a fence is exactly three backticks")
        return pos

    def _fail(self, message: str) -> None:
        if self._phase != _ERROR:
            self._phase = _ERROR
            self.error = message

    def _on_chars(self, path: Path, text: str) -> None:
        if path == ("final_answer",):
            self._answer.append(text)
            self.answer_chars.append(text)

    def _on_value(self, path: Path, value: Any) -> None:
        if path == ("action",):
            if isinstance(value, str) and value in _ACTION_TYPES:
                self.action_type = _ACTION_TYPES[value]
        elif path == ("tool_call", "tool_id") and isinstance(value, str):
            self.tool_id = value
        else:
            return
        if not self.typed and self.action_type is not None:
            self.typed = self.action_type.is_final or self.tool_id is not None

