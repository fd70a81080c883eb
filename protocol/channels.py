"""The incremental channel parser (docs/design.md#decision-protocol).

Raw model text in, in deltas of any size; block-level events out. Tags are tags only at the block
level: inside a block only its own closing tag ends it, and inside an action block only where the
action decoder is outside a JSON string — so a `final_answer` quoting `</channel:action>` or a
code channel holding tag-like text stays text. A suffix that might be the start of a tag is held
back until the next delta decides it; nothing else is ever delayed.

Everything a consumer needs travels in the events — the action's type and tool id, its decoded
answer characters, its verdict when the block closes — so the round engine never reads the
parser's or a decoder's state (docs/design.md#one-decoder).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Final

import msgspec

from protocol.actions import Action, ActionDecoder, ActionType


class Channel(StrEnum):
    THINKING = "thinking"
    ACTION = "action"
    CODE = "code"
    SUMMARY = "summary"


# -- the one spelling of the tags: the parser reads it, the prompt, the timeline and a rebuilt
#    response write it (docs/design.md#decision-protocol) -------------------------------------------

TAG_OPEN: Final = "<channel:"
TAG_CLOSE: Final = "</channel:"


def open_tag(channel: str) -> str:
    return f"{TAG_OPEN}{channel}>"


def close_tag(channel: str) -> str:
    return f"{TAG_CLOSE}{channel}>"


def render(channel: Channel, text: str) -> str:
    """One whole block."""
    return f"{TAG_OPEN}{channel}>{text}{TAG_CLOSE}{channel}>"


def render_action(action: Mapping[str, Any]) -> str:
    """One action block holding `action` as bare JSON."""
    return render(Channel.ACTION, json.dumps(action, ensure_ascii=False))


def render_open_answer(answer_so_far: str) -> str:
    """A complete action left open right after the last answer character the user saw: how a
    response cut mid-answer is rebuilt to be continued (docs/design.md#continuation)."""
    return open_tag(Channel.ACTION) + '{"action": "complete", "final_answer": "' + json_escape(answer_so_far)


def json_escape(text: str) -> str:
    """`text` as it appears inside a JSON string (the answer as the model wrote it)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class BlockOpened(msgspec.Struct, frozen=True):
    channel: Channel
    index: int          # the action's ordinal for action blocks, else 0


class BlockText(msgspec.Struct, frozen=True):
    channel: Channel    # thinking, code or summary (action text goes through the decoder)
    text: str


class BlockClosed(msgspec.Struct, frozen=True):
    """A thinking, code or summary block closed (an action block ends with `ActionClosed`)."""

    channel: Channel


class ActionTyped(msgspec.Struct, frozen=True):
    """The action type — and for call_tool the tool id — is determined: the gate may decide."""

    index: int
    action: ActionType
    tool_id: str | None


class AnswerText(msgspec.Struct, frozen=True):
    index: int
    text: str           # decoded (JSON-unescaped) final_answer characters


class ActionFailed(msgspec.Struct, frozen=True):
    """The action's text can no longer become a valid action (said once, as soon as it is so)."""

    index: int
    error: str


class ActionClosed(msgspec.Struct, frozen=True):
    """An action block ended: its verdict, from the same decoder that streamed it."""

    index: int
    action: Action | None
    violations: tuple[str, ...]
    cut: bool = False   # the stream ended inside the block
    code: str | None = None   # the notice code of an action that is None (default: protocol_violation.schema)


class ChannelViolation(msgspec.Struct, frozen=True):
    message: str


# The events are frozen msgspec Structs, not frozen dataclasses: one or more is built per delta, and
# a Struct is built in ~0.1 µs where a frozen dataclass's __init__ takes ~0.4 µs.
ParserEvent = (
    BlockOpened | BlockText | BlockClosed | ActionTyped | AnswerText | ActionFailed | ActionClosed | ChannelViolation
)

_OPEN_TAG = re.compile(re.escape(TAG_OPEN) + r"([a-z_]{1,32})>")
_TAG_PREFIX_MAX: Final = len(TAG_CLOSE) + 32 + 1
# What a cut opening tag can be: "<", "<c", … "<channel:", then a partial name.
_OPEN_TAG_START = re.compile(
    "".join(f"{re.escape(ch)}(?:" for ch in TAG_OPEN) + "[a-z_]*" + ")?" * len(TAG_OPEN)
)
_WS = re.compile(r"[ \t\n\r]*")
_TEXT_CHANNELS: Final = {c.value: c for c in (Channel.THINKING, Channel.CODE, Channel.SUMMARY)}
_CHANNELS: Final = {c.value: c for c in Channel}  # by tag name; a dict lookup, not Channel(name), per delta
_ACTION_BLOCK: Final = Channel.ACTION.value  # read per delta: a plain str, not an Enum member lookup


class ChannelParser:
    """Feeds on raw text; yields ParserEvents; keeps one ActionDecoder for the open action block."""

    __slots__ = ("_actions", "_actions_closed", "_block", "_close", "_decoder", "_failed", "_held", "_seen", "_typed")

    def __init__(self) -> None:
        self._held = ""                     # a possible tag start cut by a delta boundary
        self._block: str | None = None      # the open block's channel name (may be unknown)
        self._close = ""                    # its closing tag
        self._seen: dict[str, int] = {}     # blocks opened so far, by channel
        self._actions_closed = False        # a code or summary block came: no more actions
        self._actions = 0                   # action blocks opened so far
        self._decoder: ActionDecoder | None = None  # the open action block's decoder
        self._typed = False                 # ... its ActionTyped was sent
        self._failed = False                # ... its ActionFailed was sent

    def feed(self, delta: str) -> list[ParserEvent]:
        events: list[ParserEvent] = []
        text = self._held + delta if self._held else delta
        self._held = ""
        pos, n = 0, len(text)
        while pos < n:
            block = self._block
            if block is None:
                pos = self._between_blocks(text, pos, events)
            elif block == _ACTION_BLOCK:
                pos = self._in_action(text, pos, events)
            else:
                pos = self._in_text_block(text, pos, events)
            if pos < 0:  # held back a possible tag start
                break
        return events

    def finish(self) -> list[ParserEvent]:
        """End of stream: held text is what it is; an open block is a violation."""
        events: list[ParserEvent] = []
        held, self._held = self._held, ""
        decoder = self._decoder
        if held:
            if self._block is None:
                events.append(ChannelViolation("text outside the channel blocks"))
            elif decoder is not None:
                stop = decoder.feed(held)
                if stop < len(held):
                    decoder.reject(held[stop])
                self._collect(decoder, events)
            else:
                self._text(held, events)
        if self._block is not None:
            name = self._block.removeprefix("ignored:")  # the model wrote the bare name
            events.append(ChannelViolation(f"block {open_tag(name)} was not closed"))
            if decoder is not None:
                self._close_action(decoder, events, cut=True)
            self._block = None
        return events

    # -- block level -------------------------------------------------------------------------

    def _between_blocks(self, text: str, pos: int, events: list[ParserEvent]) -> int:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos >= len(text):
            return pos
        if text[pos] != "<":
            lt = text.find("<", pos)
            events.append(ChannelViolation("text outside the channel blocks"))
            return len(text) if lt < 0 else lt
        m = _OPEN_TAG.match(text, pos)
        if m is None:
            rest = text[pos:]
            if len(rest) < _TAG_PREFIX_MAX and _OPEN_TAG_START.fullmatch(rest):
                self._held = rest
                return -1
            events.append(ChannelViolation("text outside the channel blocks"))
            lt = text.find("<", pos + 1)
            return len(text) if lt < 0 else lt
        self._open(m.group(1), events)
        return m.end()

    def _open(self, name: str, events: list[ParserEvent]) -> None:
        self._block, self._close = name, close_tag(name)
        count = self._seen.get(name, 0)
        self._seen[name] = count + 1
        channel = _CHANNELS.get(name)
        if channel is None:
            events.append(ChannelViolation(f"unknown channel {open_tag(name)}"))
            return
        problem = self._order_problem(channel, count)
        if problem:
            events.append(ChannelViolation(problem))
            self._block = "ignored:" + name  # swallowed: an out-of-order block never reaches a lane
            return
        if channel is Channel.ACTION:
            self._decoder, self._typed, self._failed = ActionDecoder(), False, False
            self._actions += 1
            events.append(BlockOpened(channel, self._actions - 1))
        else:
            if channel is not Channel.THINKING:
                self._actions_closed = True
            events.append(BlockOpened(channel, 0))

    def _order_problem(self, channel: Channel, count: int) -> str:
        if channel is Channel.THINKING:
            return "" if count == 0 and len(self._seen) == 1 else "thinking must come first, exactly once"
        if Channel.THINKING not in self._seen:
            return "thinking must come first, exactly once"
        if channel is Channel.ACTION:
            return "action blocks must come before code and summary" if self._actions_closed else ""
        return f"at most one {channel} block" if count else ""

    # -- inside blocks -----------------------------------------------------------------------

    def _in_text_block(self, text: str, pos: int, events: list[ParserEvent]) -> int:
        close = self._close
        lt = text.find("<", pos)
        while lt >= 0:
            if text.startswith(close, lt):
                self._text(text[pos:lt], events)
                self._end_text_block(events)
                return lt + len(close)
            tail = text[lt:]
            if len(tail) < len(close) and close.startswith(tail):
                self._text(text[pos:lt], events)
                self._held = tail
                return -1
            lt = text.find("<", lt + 1)
        self._text(text[pos:], events)
        return len(text)

    def _text(self, chunk: str, events: list[ParserEvent]) -> None:
        channel = _TEXT_CHANNELS.get(self._block or "")
        if chunk and channel is not None:  # an unknown or ignored block is swallowed
            events.append(BlockText(channel, chunk))

    def _end_text_block(self, events: list[ParserEvent]) -> None:
        channel = _TEXT_CHANNELS.get(self._block or "")
        self._block = None
        if channel is not None:
            events.append(BlockClosed(channel))

    def _in_action(self, text: str, pos: int, events: list[ParserEvent]) -> int:
        decoder = self._decoder
        assert decoder is not None
        close = self._close
        while True:
            if decoder.failed:
                stop = text.find("<", pos)  # the JSON is lost: only the literal tag matters now
                pos = len(text) if stop < 0 else stop
            else:
                pos = decoder.feed(text, pos)
                self._collect(decoder, events)
            if pos >= len(text):
                return pos
            # text[pos] is a `<` outside any JSON string.
            if text.startswith(close, pos):
                self._close_action(decoder, events, cut=False)
                self._block = None
                return pos + len(close)
            tail = text[pos:]
            if len(tail) < len(close) and close.startswith(tail):
                self._held = tail
                return -1
            if not decoder.failed:
                decoder.reject("<")
                self._collect(decoder, events)
            pos += 1

    def _collect(self, decoder: ActionDecoder, events: list[ParserEvent]) -> None:
        index = self._actions - 1
        if decoder.typed and not self._typed:
            self._typed = True
            assert decoder.action_type is not None
            events.append(ActionTyped(index, decoder.action_type, decoder.tool_id))
        answer = decoder.take_answer()
        if answer:
            events.append(AnswerText(index, answer))
        if decoder.failed and not self._failed:
            self._failed = True
            events.append(ActionFailed(index, decoder.error or "invalid action"))

    def _close_action(self, decoder: ActionDecoder, events: list[ParserEvent], *, cut: bool) -> None:
        decoder.finish()
        self._collect(decoder, events)
        action, violations = decoder.result()
        events.append(ActionClosed(self._actions - 1, action, tuple(violations), cut=cut))
        self._decoder = None
