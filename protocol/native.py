"""The native decoder: a model's own function-calling stream, read as the round engine reads the
channel protocol (docs/design.md#native).

Typed model deltas in (`protocol/deltas.py`), the channel parser's events out
(`protocol/channels.py`): the engine, its gates, `emitted_chars`, salvage and notices are one
implementation for both protocols. The mapping:

| model delta | events |
|---|---|
| reasoning | thinking text (the thinking lane) |
| a call starts (its name is known) | an action block opens, typed `call_tool` with the tool id: the gate decides at once |
| argument fragments | nothing: arguments are whole only when the call ends |
| a call ends | the action closes with the decoded arguments, or with the violations that keep it from running |
| content | the answer lane: a `complete` action, once the content is told apart from a preamble |
| the message ends | whatever content is held becomes the answer; every open action closes |

**Preambles.** Content written before a call in the same message ("I'll check the weather for
you.") is a preamble, not an answer: it goes to the thinking lane when the call starts, and never
into `answer.delta` or `final_answer`. Content is held back until the first of:
- a call starts: it was a preamble (thinking lane);
- the message ends: it is the answer;
- `hold_chars` characters arrived: it is the answer, released and streamed on. A call after that
  in the same message is an action after the final one, denied like any other.
`hold_chars=None` holds until a call or the end: the turn passes it in rounds where finishing is
not legal, where content can never be an answer, so the hold costs nothing there.

`names` maps each function name the model may write to its tool id (`actors/functions.py`); a name
it does not know is taken as the tool id it is, and the gates refuse it. A tool that reads the code
channel (`code_tools`) gets its code as the `code` argument, which closes as the round's code block.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Final

import msgspec

from protocol.actions import ActionType, CallTool, Finish
from protocol.channels import (
    ActionClosed,
    ActionTyped,
    AnswerText,
    BlockClosed,
    BlockOpened,
    BlockText,
    Channel,
    ParserEvent,
)
from protocol.deltas import ModelDelta, ModelOutput, ReasoningDelta, ToolCallArgs, ToolCallEnd, ToolCallStart
from protocol.notices import NoticeCode

CODE_ARGUMENT: Final = "code"
_NOT_A_NAME_CHAR: Final = re.compile(r"[^A-Za-z0-9_-]")
_NOT_JSON: Final = "the arguments are not valid JSON"
_NOT_OBJECT: Final = "the arguments must be a JSON object"
_DECODE: Final = msgspec.json.Decoder()


def function_name(tool_id: str) -> str:
    """The function a tool is offered as: its id with every character providers refuse in a name
    (outside `[A-Za-z0-9_-]`) replaced by `_`: `demo.weather` → `demo_weather`."""
    return _NOT_A_NAME_CHAR.sub("_", tool_id)


class NativeDecoder:
    """One round's native output → ParserEvents. Continuations feed the same decoder."""

    __slots__ = ("_answer", "_answer_text", "_args", "_calls", "_code_tools", "_held", "_hold", "_names",
                 "_next", "_tool_ids", "preamble")

    def __init__(self, names: Mapping[str, str], *, hold_chars: int | None, code_tools: Collection[str] = ()) -> None:
        self._names = names
        self._hold = hold_chars
        self._code_tools = code_tools
        self._next = 0                          # the next action index
        self._calls: dict[int, int] = {}        # provider index → action index, while the call is open
        self._tool_ids: dict[int, str] = {}     # action index → tool id
        self._args: dict[int, list[str]] = {}   # action index → argument fragments
        self._held: list[str] = []              # content not yet told apart from a preamble
        self._answer: int | None = None         # the answer action's index, once content is the answer
        self._answer_text: list[str] = []
        self.preamble = ""                      # content that turned out to be a preamble

    def feed(self, delta: ModelOutput) -> list[ParserEvent]:
        kind = type(delta)
        if kind is ModelDelta:
            return self._content(delta.text)  # type: ignore[union-attr]
        if kind is ReasoningDelta:
            text = delta.text  # type: ignore[union-attr]
            return [BlockText(Channel.THINKING, text)] if text else []
        if kind is ToolCallArgs:
            index = self._calls.get(delta.index)  # type: ignore[union-attr]
            if index is not None:
                self._args[index].append(delta.fragment)  # type: ignore[union-attr]
            return []
        if kind is ToolCallStart:
            return self._start(delta)  # type: ignore[arg-type]
        if kind is ToolCallEnd:
            index = self._calls.pop(delta.index, None)  # type: ignore[union-attr]
            return self._close_call(index) if index is not None else []
        return []  # a signature or a redacted block: kept by the caller for the history, never shown

    def finish(self, *, stopped: bool = False) -> list[ParserEvent]:
        """The end of the round's stream. `stopped`: it was cut (a provider error, a steer, a crash);
        then open calls never run and held content was never shown."""
        events: list[ParserEvent] = []
        for index in list(self._calls.values()):
            if stopped:
                events.append(ActionClosed(index, None, (), cut=True))
            else:
                events += self._close_call(index)
        self._calls.clear()
        if stopped:
            self._held.clear()
            if self._answer is not None:
                events.append(ActionClosed(self._answer, None, (), cut=True))
            return events
        if self._held:
            events += self._open_answer()
        if self._answer is not None:
            text = "".join(self._answer_text)
            events.append(ActionClosed(self._answer, Finish(ActionType.COMPLETE, text), ()))
        return events

    @property
    def calls(self) -> Mapping[int, str]:
        """Every call the model made this round: action index → tool id (refused ones included)."""
        return self._tool_ids

    @property
    def answer_open(self) -> bool:
        return self._answer is not None

    @property
    def calls_open(self) -> bool:
        return bool(self._calls)

    # -- content ---------------------------------------------------------------------------------

    def _content(self, text: str) -> list[ParserEvent]:
        if not text:
            return []
        if self._answer is not None:
            self._answer_text.append(text)
            return [AnswerText(self._answer, text)]
        self._held.append(text)
        if self._tool_ids or (self._hold is not None and sum(map(len, self._held)) >= self._hold):
            return self._open_answer()  # after a call nothing is a preamble; past the hold it is the answer
        return []

    def _open_answer(self) -> list[ParserEvent]:
        index = self._next
        self._next += 1
        self._answer = index
        text = "".join(self._held)
        self._held.clear()
        self._answer_text.append(text)
        return [BlockOpened(Channel.ACTION, index), ActionTyped(index, ActionType.COMPLETE, None), AnswerText(index, text)]

    # -- calls --------------------------------------------------------------------------------------

    def _start(self, start: ToolCallStart) -> list[ParserEvent]:
        events: list[ParserEvent] = []
        if self._held:  # content before a call is a preamble: the thinking lane, never the answer
            preamble = "".join(self._held)
            self._held.clear()
            self.preamble += preamble
            events.append(BlockText(Channel.THINKING, preamble))
        index = self._next
        self._next += 1
        tool_id = self._names.get(start.name, start.name)
        self._calls[start.index] = index
        self._tool_ids[index] = tool_id
        self._args[index] = []
        events += [BlockOpened(Channel.ACTION, index), ActionTyped(index, ActionType.CALL_TOOL, tool_id)]
        return events

    def _close_call(self, index: int) -> list[ParserEvent]:
        tool_id = self._tool_ids[index]
        text = "".join(self._args.pop(index, ())).strip() or "{}"
        try:
            params: Any = _DECODE.decode(text)
        except msgspec.DecodeError:
            return [ActionClosed(index, None, (_NOT_JSON,), code=NoticeCode.TOOL_CALL_INVALID)]
        if not isinstance(params, dict):
            return [ActionClosed(index, None, (_NOT_OBJECT,), code=NoticeCode.TOOL_CALL_INVALID)]
        if tool_id not in self._code_tools:
            return [ActionClosed(index, CallTool(tool_id, params), ())]
        code = params.pop(CODE_ARGUMENT, None)
        events: list[ParserEvent] = [ActionClosed(index, CallTool(tool_id, params), ())]
        if isinstance(code, str):  # the code channel of a call that reads it (docs/design.md#native)
            events += [BlockOpened(Channel.CODE, 0), BlockText(Channel.CODE, code), BlockClosed(Channel.CODE)]
        return events
