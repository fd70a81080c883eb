"""Anthropic Messages SSE, decoded: bytes in, model deltas out — no socket, no event loop.

The events: message_start, content_block_start/delta/stop, message_delta, message_stop, ping,
error; other event types are ignored (Anthropic may add some). The stop reason comes in
message_delta and the usage, cumulative, in message_start and message_delta; both are kept for the
reader. An `error` event ends the stream as LiteLLM's AnthropicError does: with status 500.

The content blocks are read as the whole family of model deltas (docs/design.md#native):

| block | deltas |
|---|---|
| `text` | `text_delta` → `ModelDelta` |
| `thinking` | `thinking_delta` → `ReasoningDelta`; its `signature_delta`s → one `ReasoningSignature` when the block stops |
| `redacted_thinking` | `RedactedReasoning(data)` at its start, as it came |
| `tool_use` | `ToolCallStart(n, id, name)` at its start (n counts the message's tool_use blocks from 0); `input_json_delta` → `ToolCallArgs`; `ToolCallEnd(n)` when it stops |

What a start block already holds (text, thinking, a non-empty `input`) is the block's first
fragment. A tool_use block whose input streamed nothing has the input its start block gave (`{}`):
it is sent as the call's one fragment when the block stops, so that every call ends with its
arguments said (LiteLLM's reader writes the same `{}`). Other block types (server tools, citations)
are ignored. The stop reason `tool_use` is LiteLLM's `tool_calls`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from actors.llm.errors import ErrorDetail, Fault, Usage, stream_fault, unreadable
from actors.llm.sse import OVERSIZED, SSEFrames, fields
from actors.llm.wires import Wire
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
)


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
    text: str = ""            # text_delta
    thinking: str = ""        # thinking_delta
    signature: str = ""       # signature_delta
    partial_json: str = ""    # input_json_delta


class _ContentBlockDelta(msgspec.Struct, gc=False):
    delta: _BlockDelta | None = None


class _Block(msgspec.Struct, gc=False):
    type: str = ""
    text: str = ""
    thinking: str = ""
    signature: str = ""
    data: str = ""                         # redacted_thinking
    id: str = ""                           # tool_use
    name: str = ""
    input: msgspec.Raw = msgspec.Raw()     # kept as it came: the call's first fragment when not `{}`


class _ContentBlockStart(msgspec.Struct, gc=False):
    content_block: _Block | None = None


class _ContentBlockStop(msgspec.Struct, gc=False):
    index: int = 0


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
    b"content_block_start": msgspec.json.Decoder(_ContentBlockStart),
    b"content_block_stop": msgspec.json.Decoder(_ContentBlockStop),
    b"message_start": msgspec.json.Decoder(_MessageStart),
    b"message_delta": msgspec.json.Decoder(_MessageDelta),
    b"error": msgspec.json.Decoder(_Error),
}
_decode_type = msgspec.json.Decoder(_Typed).decode
_BLOCK_DELTA: Final = b"event: content_block_delta\ndata: "
_BLOCK_DELTA_SIZE: Final = len(_BLOCK_DELTA)
_decode_block_delta = _EVENT_DECODERS[b"content_block_delta"].decode
_decode_any = msgspec.json.Decoder().decode
_EMPTY_INPUT: Final = "{}"


class AnthropicMessagesDecoder:
    """One stream's decoder. `feed` the bytes of each read; the state says how the stream stands."""

    def __init__(self) -> None:
        self._frames = SSEFrames()
        self.done = False                      # message_stop came: the provider ended the answer
        self.failure: Fault | None = None      # an error event (or an unreadable one) ended it
        self.events = 0                        # events but pings and comments: what the idle timeout watches
        self.finish_reason: str | None = None  # the stop reason, as Anthropic said it
        self.usage: Usage | None = None
        self.calls = 0                         # tool_use blocks started in the message
        self._usage: dict[str, int] = {}
        self._call: int | None = None          # the open tool_use block's call number
        self._args = False                     # that call has had a non-empty fragment
        self._signature: list[str] = []        # the open thinking block's signature, as it streams

    def feed(self, data: bytes) -> list[ModelOutput]:
        """The deltas in `data`, in order, up to an error event (then `failure` is set: the deltas
        before it were streamed and must still be delivered)."""
        out: list[ModelOutput] = []
        n = 0
        for block in self._frames.feed(data):
            if block.startswith(_BLOCK_DELTA):   # the usual shape: a content block's delta, one data line
                try:
                    delta = _decode_block_delta(block[_BLOCK_DELTA_SIZE:]).delta
                except msgspec.DecodeError:   # more lines than one, or unreadable: the general way
                    pass
                else:
                    n += 1
                    if delta is not None:
                        if delta.type == "text_delta":
                            if delta.text:
                                out.append(ModelDelta(delta.text))
                        else:
                            self._delta(delta, out)
                    continue
            if block:
                self._general(block, out)
                if self.failure is not None:
                    break
        self.events += n
        if self.failure is None and self._frames.oversized:
            self.failure = Fault("connection", OVERSIZED)
        return out

    def _general(self, block: bytes, out: list[ModelOutput]) -> None:
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
            if decoded.delta is not None:
                if decoded.delta.type == "text_delta":
                    if decoded.delta.text:
                        out.append(ModelDelta(decoded.delta.text))
                else:
                    self._delta(decoded.delta, out)
        elif type(decoded) is _ContentBlockStart:
            self._start(decoded.content_block or _Block(), out)
        elif type(decoded) is _ContentBlockStop:
            self._stop(out)
        elif type(decoded) is _MessageDelta:
            if decoded.delta is not None and decoded.delta.stop_reason:
                self.finish_reason = decoded.delta.stop_reason
                self._stop(out)   # a tool_use block left open still ends before the message does
            self._count(decoded.usage)
        elif type(decoded) is _MessageStart:
            self._count(decoded.message.usage if decoded.message is not None else None)
        elif type(decoded) is _Error:
            self.failure = stream_fault(Wire.ANTHROPIC_MESSAGES, decoded.error, 500)

    def _start(self, block: _Block, out: list[ModelOutput]) -> None:
        """A content block opens: what it holds already is its first fragment."""
        self._stop(out)   # one block at a time: a block never stopped is stopped by the next one
        kind = block.type
        if kind == "text":
            if block.text:
                out.append(ModelDelta(block.text))
        elif kind == "thinking":
            if block.thinking:
                out.append(ReasoningDelta(block.thinking))
            if block.signature:
                self._signature.append(block.signature)
        elif kind == "redacted_thinking":
            out.append(RedactedReasoning(block.data))
        elif kind == "tool_use":
            self._call, self._args = self.calls, False
            self.calls += 1
            out.append(ToolCallStart(self._call, block.id, block.name))
            if block.input and _decode_any(block.input):   # not `{}`: its input, whole
                self._args = True
                out.append(ToolCallArgs(self._call, bytes(block.input).decode()))

    def _delta(self, delta: _BlockDelta, out: list[ModelOutput]) -> None:
        """A delta other than text, read by its type (the types say which block they belong to)."""
        kind = delta.type
        if kind == "input_json_delta":
            if self._call is not None and delta.partial_json:
                self._args = True
                out.append(ToolCallArgs(self._call, delta.partial_json))
        elif kind == "thinking_delta":
            if delta.thinking:
                out.append(ReasoningDelta(delta.thinking))
        elif kind == "signature_delta":
            self._signature.append(delta.signature)

    def _stop(self, out: list[ModelOutput]) -> None:
        """The open block ends: a call with its arguments said, a thinking block with its signature
        (one per block, after its text: the turn sends the block back as it came)."""
        if self._call is not None:
            if not self._args:
                out.append(ToolCallArgs(self._call, _EMPTY_INPUT))
            out.append(ToolCallEnd(self._call))
            self._call = None
        elif self._signature:
            out.append(ReasoningSignature("".join(self._signature)))
            self._signature.clear()

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
