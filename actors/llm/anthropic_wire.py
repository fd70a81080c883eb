"""Anthropic Messages SSE, decoded: bytes in, model deltas out — no socket, no event loop.

The events: message_start, content_block_start/delta/stop, message_delta, message_stop, ping,
error; other event types are ignored (Anthropic may add some). Only `text_delta` blocks are answer
text. The stop reason comes in message_delta and the usage, cumulative, in message_start and
message_delta; both are kept for the reader. An `error` event ends the stream as LiteLLM's
AnthropicError does: with status 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from actors.llm.errors import ErrorDetail, Fault, Usage, stream_fault, unreadable
from actors.llm.sse import OVERSIZED, SSEFrames, fields
from actors.llm.wires import Wire
from protocol.deltas import ModelDelta


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Message(msgspec.Struct, gc=False):
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct, gc=False):
    message: _Message | None = None


class _BlockDelta(msgspec.Struct, gc=False):
    type: str = ""
    text: str = ""


class _ContentBlockDelta(msgspec.Struct, gc=False):
    delta: _BlockDelta | None = None


class _StopDelta(msgspec.Struct, gc=False):
    stop_reason: str | None = None


class _MessageDelta(msgspec.Struct, gc=False):
    delta: _StopDelta | None = None
    usage: _Usage | None = None


class _Error(msgspec.Struct, gc=False):
    error: ErrorDetail | None = None


class _Typed(msgspec.Struct, gc=False):
    type: str = ""


_EVENT_DECODERS: Final[Mapping[bytes, msgspec.json.Decoder[Any]]] = {
    b"content_block_delta": msgspec.json.Decoder(_ContentBlockDelta),
    b"message_start": msgspec.json.Decoder(_MessageStart),
    b"message_delta": msgspec.json.Decoder(_MessageDelta),
    b"error": msgspec.json.Decoder(_Error),
}
_decode_type = msgspec.json.Decoder(_Typed).decode
_BLOCK_DELTA: Final = b"event: content_block_delta\ndata: "
_BLOCK_DELTA_SIZE: Final = len(_BLOCK_DELTA)
_decode_block_delta = _EVENT_DECODERS[b"content_block_delta"].decode


class AnthropicMessagesDecoder:
    """One stream's decoder. `feed` the bytes of each read; the state says how the stream stands."""

    def __init__(self) -> None:
        self._frames = SSEFrames()
        self.done = False                      # message_stop came: the provider ended the answer
        self.failure: Fault | None = None      # an error event (or an unreadable one) ended it
        self.events = 0                        # events but pings and comments: what the idle timeout watches
        self.finish_reason: str | None = None  # the stop reason, as Anthropic said it
        self.usage: Usage | None = None
        self._usage: dict[str, int] = {}

    def feed(self, data: bytes) -> list[ModelDelta]:
        """The deltas in `data`, in order, up to an error event (then `failure` is set: the deltas
        before it were streamed and must still be delivered)."""
        out: list[ModelDelta] = []
        n = 0
        for block in self._frames.feed(data):
            if block.startswith(_BLOCK_DELTA):   # the usual shape: a content block's delta, one data line
                try:
                    delta = _decode_block_delta(block[_BLOCK_DELTA_SIZE:]).delta
                except msgspec.DecodeError:   # more lines than one, or unreadable: the general way
                    pass
                else:
                    n += 1
                    if delta is not None and delta.type == "text_delta" and delta.text:
                        out.append(ModelDelta(delta.text))
                    continue
            if block:
                self._general(block, out)
                if self.failure is not None:
                    break
        self.events += n
        if self.failure is None and self._frames.oversized:
            self.failure = Fault("connection", OVERSIZED)
        return out

    def _general(self, block: bytes, out: list[ModelDelta]) -> None:
        """A block in any other shape, read by its event type (an error event, or one it cannot read,
        sets `failure`)."""
        event = fields(block)
        if event is None:
            return
        name, data = event
        try:
            if not name:   # no `event:` line: the type is in the data
                name = _decode_type(data).type.encode()
            decoder = _EVENT_DECODERS.get(name)
            if name != b"ping":
                self.events += 1
            if decoder is None:
                if name == b"message_stop":
                    self.done = True
                return
            decoded = decoder.decode(data)
        except msgspec.DecodeError as exc:
            self.failure = unreadable(exc)
            return
        if type(decoded) is _ContentBlockDelta:
            if decoded.delta is not None and decoded.delta.type == "text_delta" and decoded.delta.text:
                out.append(ModelDelta(decoded.delta.text))
        elif type(decoded) is _MessageDelta:
            if decoded.delta is not None and decoded.delta.stop_reason:
                self.finish_reason = decoded.delta.stop_reason
            self._count(decoded.usage)
        elif type(decoded) is _MessageStart:
            self._count(decoded.message.usage if decoded.message is not None else None)
        elif type(decoded) is _Error:
            self.failure = stream_fault(Wire.ANTHROPIC_MESSAGES, decoded.error, 500)

    def _count(self, usage: _Usage | None) -> None:
        """Usage is cumulative and message_delta may omit what message_start reported; prompt tokens
        include cache writes and reads, as LiteLLM counts them."""
        if usage is None:
            return
        for field in usage.__struct_fields__:
            value = getattr(usage, field)
            if value is not None:
                self._usage[field] = value
        u = self._usage
        prompt = u.get("input_tokens", 0) + u.get("cache_creation_input_tokens", 0) + u.get("cache_read_input_tokens", 0)
        self.usage = Usage(prompt, u.get("output_tokens", 0))

    def end_reason(self) -> str | None:
        """The finish reason the stream ended with; None: it was cut. A message_stop without a stop
        reason is a finished answer LiteLLM calls "stop"."""
        return self.finish_reason or ("stop" if self.done else None)
