"""The action schema and its incremental decoder (docs/design.md#decision-protocol).

One `ActionDecoder` per action block reads the block's text — an optional Markdown fence around
one JSON object — and reports, as soon as they are determined, the action type, the tool id and
the JSON-unescaped `final_answer` characters, whatever the key order. When the block closes, the
post-stream check reads `result()` of the same decoder: there is no second parse
(docs/design.md#one-decoder).

The decoder's phases and the characters that move between them are tables (`_NEXT`,
`_UNEXPECTED`, `_AT_END`); `feed` only walks them.
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
        return self is not _CALL_TOOL  # asked per answer delta (by the gate)


# Enum members read per delta are bound once: on Python 3.11 reading one through its class
# (`ActionType.CALL_TOOL`) costs ~0.15 µs each time.
_CALL_TOOL: Final = ActionType.CALL_TOOL


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


def call_tool_action(tool_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A call_tool action as JSON data: how a recorded call is written back to a model."""
    return {"action": "call_tool", "tool_call": {"tool_id": tool_id, "params": params}}

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


def validate_action(obj: Any) -> tuple[Action | None, list[str]]:
    """Check one decoded action object against the schema. Violations name keys, never values
    (rejected parameters are not echoed back to the model: docs/design.md#timeline)."""
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


# -- the decoder's machine ------------------------------------------------------------------------


class _Phase:
    """The decoder's phases. Plain strings, not an Enum: the phase is read several times per
    delta, and on Python 3.11 reading an Enum member through its class costs ~0.1 µs each time."""

    LEAD: Final = "lead"                  # before the JSON object or an opening fence
    FENCE_OPEN: Final = "fence_open"      # counting the opening backticks
    FENCE_LANG: Final = "fence_lang"      # the fence's language word
    AFTER_FENCE: Final = "after_fence"    # between the opening fence and the object
    JSON: Final = "json"                  # inside the object: the JSON stream decides
    TRAIL: Final = "trail"                # after the object: whitespace, or the closing fence
    FENCE_CLOSE: Final = "fence_close"    # counting the closing backticks
    DONE: Final = "done"                  # the closing fence is complete: only whitespace may follow
    ERROR: Final = "error"


NOT_AN_OBJECT: Final = "expected a JSON object, bare or in a ``` fence"
TEXT_AFTER: Final = "unexpected text after the action JSON"
BAD_FENCE_LANG: Final = "unsupported fence language (accepted: ```, ```json, ```JSON)"
BAD_FENCE: Final = "a fence is exactly three backticks"
UNCLOSED_FENCE: Final = "the ``` fence is not closed"
NO_OBJECT: Final = "the action block holds no JSON object"

# (phase, character) → next phase, for the characters that move the decoder between phases;
# any other non-whitespace character is the error `_UNEXPECTED` names for that phase.
# A closing fence is only accepted after an opening one (checked in `_between`).
_NEXT: Final[Mapping[tuple[str, str], str]] = {
    (_Phase.LEAD, "`"): _Phase.FENCE_OPEN,
    (_Phase.LEAD, "{"): _Phase.JSON,
    (_Phase.AFTER_FENCE, "{"): _Phase.JSON,
    (_Phase.TRAIL, "`"): _Phase.FENCE_CLOSE,
}
_UNEXPECTED: Final[Mapping[str, str]] = {
    _Phase.LEAD: NOT_AN_OBJECT,
    _Phase.AFTER_FENCE: NOT_AN_OBJECT,
    _Phase.TRAIL: TEXT_AFTER,
    _Phase.DONE: TEXT_AFTER,
}
# The block closed in this phase: the verdict (None: complete). JSON, FENCE_CLOSE and a fenced
# TRAIL depend on more than the phase and are decided in `finish`.
_AT_END: Final[Mapping[str, str | None]] = {
    _Phase.LEAD: NO_OBJECT,
    _Phase.FENCE_OPEN: NO_OBJECT,
    _Phase.FENCE_LANG: NO_OBJECT,
    _Phase.AFTER_FENCE: NO_OBJECT,
    _Phase.TRAIL: None,
    _Phase.DONE: None,
}


class ActionDecoder:
    """Decodes one action block incrementally; see the module docstring.

    Live view: `action_type`, `tool_id`, `typed` (the gate may decide), `answer_so_far()`, and
    `take_answer()` for the `final_answer` characters decoded since the last call. Verdict:
    `result()` once the block closed (`finish()`).
    """

    __slots__ = (
        "_answer",
        "_fenced",
        "_json",
        "_lang",
        "_phase",
        "_ticks",
        "_untaken",
        "action_type",
        "error",
        "tool_id",
        "typed",
    )

    def __init__(self) -> None:
        self._phase: str = _Phase.LEAD
        self._fenced = False
        self._ticks = 0
        self._lang = ""
        self._json = JsonStream(on_chars=self._on_chars, on_value=self._on_value)
        self._answer: list[str] = []       # every decoded final_answer piece
        self._untaken: list[str] = []      # ... not yet handed out by take_answer()
        self.action_type: ActionType | None = None
        self.tool_id: str | None = None
        self.typed = False                 # action type (and tool id for call_tool) determined
        self.error: str | None = None

    # -- live view ------------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self._phase is _Phase.ERROR

    def answer_so_far(self) -> str:
        return "".join(self._answer)

    def take_answer(self) -> str:
        """The final_answer characters decoded since the last call ("" when none)."""
        if not self._untaken:
            return ""
        text = "".join(self._untaken)
        self._untaken.clear()
        return text

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, text: str, pos: int = 0) -> int:
        """Consume text[pos:]; stop at a `<` outside any JSON string and return its index
        (the channel parser decides whether it starts the closing tag), else return len(text).
        Inside a JSON string a tag-like `<` is text, not structure (docs/design.md#decision-protocol)."""
        n = len(text)
        while pos < n:
            phase = self._phase
            if phase is _Phase.JSON:
                pos = self._json.feed(text, pos, stop_at="<")
                if self._json.failed:
                    self._fail(f"invalid JSON: {self._json.error}")
                elif self._json.done:
                    self._phase = _Phase.TRAIL
                    continue
                return pos
            if phase is _Phase.ERROR:
                return pos
            if phase is _Phase.FENCE_OPEN:
                pos = self._count_ticks(text, pos, then=_Phase.FENCE_LANG)
            elif phase is _Phase.FENCE_CLOSE:
                pos = self._count_ticks(text, pos, then=_Phase.DONE)
            elif phase is _Phase.FENCE_LANG:
                pos = self._fence_lang(text, pos)
            else:
                pos = self._between(text, pos)
                if pos < n and text[pos] == "<":
                    return pos
        return pos

    def reject(self, what: str) -> None:
        """The parser met `what` (a `<` that does not start the closing tag) where we stopped."""
        if self._phase is _Phase.JSON:
            self._fail("invalid JSON: unexpected '<'")
        else:
            self._fail(f"unexpected {what!r} in the action block")

    def finish(self) -> None:
        """The block closed (or the stream ended)."""
        phase = self._phase
        if phase is _Phase.ERROR:
            return
        if phase is _Phase.JSON:
            self._json.finish()
            self._fail(f"invalid JSON: {self._json.error}")
        elif phase is _Phase.FENCE_CLOSE:
            if self._ticks == 3:
                self._phase = _Phase.DONE  # the closing fence was the last thing in the block
            else:
                self._fail(UNCLOSED_FENCE)
        elif phase is _Phase.TRAIL and self._fenced:
            self._fail(UNCLOSED_FENCE)
        else:
            problem = _AT_END[phase]
            if problem is not None:
                self._fail(problem)

    def result(self) -> tuple[Action | None, list[str]]:
        """The post-stream verdict, read from this decoder's own final state."""
        if self.error is not None:
            return None, [self.error]
        if self._phase not in (_Phase.TRAIL, _Phase.DONE):
            return None, ["the action JSON is incomplete"]
        return validate_action(self._json.value)

    # -- phases ------------------------------------------------------------------------------

    def _between(self, text: str, pos: int) -> int:
        """LEAD, AFTER_FENCE, TRAIL, DONE: whitespace, or one character from `_NEXT`."""
        ch = text[pos]
        if ch in " \t\n\r":
            return _WS.match(text, pos).end()  # type: ignore[union-attr]
        if ch == "<":
            return pos
        phase = self._phase
        nxt = _NEXT.get((phase, ch))
        if nxt is None or (nxt is _Phase.FENCE_CLOSE and not self._fenced):
            self._fail(_UNEXPECTED[phase])
            return pos
        if nxt is _Phase.FENCE_OPEN:
            self._fenced = True
        if nxt is _Phase.FENCE_OPEN or nxt is _Phase.FENCE_CLOSE:
            self._ticks = 0
            self._phase = nxt
            return pos  # the tick is counted by _count_ticks
        self._phase = nxt
        return pos  # `{` is the JSON stream's first character

    def _fence_lang(self, text: str, pos: int) -> int:
        end = _LANG.match(text, pos).end()  # type: ignore[union-attr]
        if end > pos:
            self._lang += text[pos:end]
            if len(self._lang) > 4:
                self._fail(BAD_FENCE_LANG)
            return end
        if self._lang not in FENCE_LANGS:
            self._fail(BAD_FENCE_LANG)
            return pos
        self._phase = _Phase.AFTER_FENCE  # `{` may follow the language on the same line
        return pos

    def _count_ticks(self, text: str, pos: int, then: str) -> int:
        n = len(text)
        while pos < n and text[pos] == "`":
            self._ticks += 1
            pos += 1
        # The run ends only at a non-tick character: a fourth tick may still come in the next
        # delta, and the verdict must not depend on where the deltas were cut (docs/design.md#one-decoder).
        if self._ticks > 3:
            self._fail(BAD_FENCE)
        elif pos < n:
            if self._ticks == 3:
                self._phase = then
            else:
                self._fail(BAD_FENCE)
        return pos

    def _fail(self, message: str) -> None:
        if self._phase is not _Phase.ERROR:
            self._phase = _Phase.ERROR
            self.error = message

    def _on_chars(self, path: Path, text: str) -> None:
        if path == ("final_answer",):
            self._answer.append(text)
            self._untaken.append(text)

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
