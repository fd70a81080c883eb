"""The incremental channel parser (SPEC §2).

Raw model text in, in deltas of any size; block-level events out. Tags are tags only at the block
level: inside a block only its own closing tag ends it, and inside an action block only where the
action decoder is outside a JSON string — so a `final_answer` quoting `</channel:action>` or a
code channel holding tag-like text stays text. A suffix that might be the start of a tag is held
back until the next delta decides it; nothing else is ever delayed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from protocol.actions import ActionDecoder


class Channel(StrEnum):
    THINKING = "thinking"
    ACTION = "action"
    CODE = "code"
    SUMMARY = "summary"


@dataclass(frozen=True, slots=True)
class BlockOpened:
    channel: Channel
    index: int          # the action's ordinal for action blocks, else 0


@dataclass(frozen=True, slots=True)
class BlockText:
    channel: Channel    # thinking, code or summary (action text goes through the decoder)
    text: str


@dataclass(frozen=True, slots=True)
class ActionTyped:
    """The action type — and for call_tool the tool id — is determined: the gate may decide."""

    index: int


@dataclass(frozen=True, slots=True)
class AnswerText:
    index: int
    text: str           # decoded (JSON-unescaped) final_answer characters


@dataclass(frozen=True, slots=True)
class BlockClosed:
    channel: Channel
    index: int


@dataclass(frozen=True, slots=True)
class ChannelViolation:
    message: str


ParserEvent = BlockOpened | BlockText | ActionTyped | AnswerText | BlockClosed | ChannelViolation

_OPEN_TAG = re.compile(r"<channel:([a-z_]{1,32})>")
_TAG_PREFIX_MAX: Final = len("</channel:") + 32 + 1
_WS = re.compile(r"[ \t\n\r]*")
_TEXT_CHANNELS: Final = frozenset({Channel.THINKING, Channel.CODE, Channel.SUMMARY})
_CHANNELS: Final = {c.value: c for c in Channel}  # by tag name; a dict lookup, not Channel(name), per delta


def _close_tag(channel: str) -> str:
    return f"</channel:{channel}>"


class ChannelParser:
    """Feeds on raw text; yields ParserEvents; keeps one ActionDecoder per action block."""

    __slots__ = ("_actions_closed", "_block", "_close", "_held", "_seen", "actions", "code", "summary", "thinking")

    def __init__(self) -> None:
        self._held = ""                     # a possible tag start cut by a delta boundary
        self._block: str | None = None      # the open block's channel name (may be unknown)
        self._close = ""                    # its closing tag
        self._seen: dict[str, int] = {}     # blocks opened so far, by channel
        self._actions_closed = False        # a code or summary block came: no more actions
        self.actions: list[ActionDecoder] = []
        self.thinking: list[str] = []
        self.code: list[str] = []
        self.summary: list[str] = []

    @property
    def open_block(self) -> str | None:
        return self._block

    def feed(self, delta: str) -> list[ParserEvent]:
        events: list[ParserEvent] = []
        text = self._held + delta if self._held else delta
        self._held = ""
        pos, n = 0, len(text)
        while pos < n:
            block = self._block
            if block is None:
                pos = self._between_blocks(text, pos, events)
            elif block == Channel.ACTION:
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
        if held:
            if self._block is None:
                events.append(ChannelViolation("text outside the channel blocks"))
            elif self._block == Channel.ACTION:
                decoder = self.actions[-1]
                stop = decoder.feed(held)
                if stop < len(held):
                    decoder.reject(held[stop])
                self._collect(decoder, len(self.actions) - 1, events)
            else:
                self._text(held, events)
        if self._block is not None:
            name = self._block.removeprefix("ignored:")  # the model wrote the bare name
            events.append(ChannelViolation(f"block <channel:{name}> was not closed"))
            if self._block == Channel.ACTION:
                self.actions[-1].finish()
                self._collect(self.actions[-1], len(self.actions) - 1, events)
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
            if len(rest) < _TAG_PREFIX_MAX and re.fullmatch(r"<(c(h(a(n(n(e(l(:[a-z_]*)?)?)?)?)?)?)?)?", rest):
                self._held = rest
                return -1
            events.append(ChannelViolation("text outside the channel blocks"))
            lt = text.find("<", pos + 1)
            return len(text) if lt < 0 else lt
        self._open(m.group(1), events)
        return m.end()

    def _open(self, name: str, events: list[ParserEvent]) -> None:
        self._block, self._close = name, _close_tag(name)
        count = self._seen.get(name, 0)
        self._seen[name] = count + 1
        channel = _CHANNELS.get(name)
        if channel is None:
            events.append(ChannelViolation(f"unknown channel <channel:{name}>"))
            return
        problem = self._order_problem(channel, count)
        if problem:
            events.append(ChannelViolation(problem))
            self._block = "ignored:" + name  # swallowed: an out-of-order block never reaches a lane
            return
        if channel is Channel.ACTION:
            self.actions.append(ActionDecoder())
            events.append(BlockOpened(channel, len(self.actions) - 1))
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
                self._end_block(events)
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
        if not chunk:
            return
        block = self._block
        if block == Channel.THINKING:
            self.thinking.append(chunk)
        elif block == Channel.CODE:
            self.code.append(chunk)
        elif block == Channel.SUMMARY:
            self.summary.append(chunk)
        else:
            return  # an unknown or ignored block: swallowed
        events.append(BlockText(_CHANNELS[block], chunk))

    def _in_action(self, text: str, pos: int, events: list[ParserEvent]) -> int:
        index = len(self.actions) - 1
        decoder = self.actions[index]
        close = self._close
        while True:
            if decoder.failed:
                stop = text.find("<", pos)  # the JSON is lost: only the literal tag matters now
                pos = len(text) if stop < 0 else stop
            else:
                pos = decoder.feed(text, pos)
                self._collect(decoder, index, events)
            if pos >= len(text):
                return pos
            # text[pos] is a `<` outside any JSON string.
            if text.startswith(close, pos):
                decoder.finish()
                self._collect(decoder, index, events)
                self._end_block(events)
                return pos + len(close)
            tail = text[pos:]
            if len(tail) < len(close) and close.startswith(tail):
                self._held = tail
                return -1
            if not decoder.failed:
                decoder.reject("<")
            pos += 1

    def _collect(self, decoder: ActionDecoder, index: int, events: list[ParserEvent]) -> None:
        if decoder.typed and not decoder.announced:
            decoder.announced = True
            events.append(ActionTyped(index))
        if decoder.answer_chars:
            events.append(AnswerText(index, "".join(decoder.answer_chars)))
            decoder.answer_chars.clear()

    def _end_block(self, events: list[ParserEvent]) -> None:
        block = self._block
        self._block = None
        if block in _TEXT_CHANNELS:
            events.append(BlockClosed(_CHANNELS[block], 0))
        elif block == Channel.ACTION:
            events.append(BlockClosed(Channel.ACTION, len(self.actions) - 1))
