"""OpenAI chat-completions SSE, decoded: bytes in, model deltas out — no socket, no event loop.

The wire of every OpenAI-compatible provider the fast path reads (`wires.PROVIDER_WIRES`):
`data: {chat.completion.chunk}` events, then `data: [DONE]`. An error inside the stream is a chunk
with an `error` member (with or without `event: error`), as the OpenAI SDK reads it. Each chunk is
decoded once, straight into typed structs; the finish reason and the usage (a chunk of its own after
the finish chunk, when `stream_options.include_usage` asked for it) are kept for the reader.

A chunk's delta is read as the whole family of model deltas (docs/design.md#native), in this order:
`reasoning` / `reasoning_content` → `ReasoningDelta` (`reasoning` first when both come, as LiteLLM
maps them); `content` → `ModelDelta`; `tool_calls[]` by `index` → `ToolCallStart(index, id, name)` at
an index's first fragment (where id and name come), then `ToolCallArgs` per non-empty `arguments`
fragment. The wire never says a call's arguments are complete, so the finish reason ends every
started call (`ToolCallEnd`, in index order): readers end every call before the message ends.
"""

from __future__ import annotations

import msgspec

from actors.llm.errors import ErrorDetail, Fault, Usage, stream_fault, unreadable
from actors.llm.sse import OVERSIZED, SSEFrames, fields
from actors.llm.wires import Wire
from protocol.deltas import ModelDelta, ModelOutput, ReasoningDelta, ToolCallArgs, ToolCallEnd, ToolCallStart


class _Function(msgspec.Struct, gc=False):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct, gc=False):
    index: int = 0
    id: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None
    reasoning_content: str | None = None   # DeepSeek, older vLLM
    reasoning: str | None = None           # OpenRouter, newer vLLM
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct, gc=False):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct, gc=False):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: ErrorDetail | str | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


class OpenAIChatDecoder:
    """One stream's decoder. `feed` the bytes of each read; the state says how the stream stands."""

    def __init__(self) -> None:
        self._frames = SSEFrames()
        self.done = False                      # `data: [DONE]` came: the provider ended the answer
        self.failure: Fault | None = None      # an error event (or an unreadable one) ended it
        self.events = 0                        # chunks, not keep-alives: what the idle timeout watches
        self.finish_reason: str | None = None  # as the provider said it
        self.usage: Usage | None = None
        self.calls = 0                         # calls started in the message
        self._open: list[int] = []             # the indices of the calls started and not yet ended

    def feed(self, data: bytes) -> list[ModelOutput]:
        """The deltas in `data`, in order, up to an error event (then `failure` is set: the deltas
        before it were streamed and must still be delivered)."""
        out: list[ModelOutput] = []
        chunk: _Chunk | None
        for block in self._frames.feed(data):
            if block.startswith(b"data: {"):   # the usual shape: one data line holding a chunk
                try:
                    chunk = _decode_chunk(block[6:])
                except msgspec.DecodeError:   # more lines than one, or unreadable: the general way
                    chunk = self._general(block)
            elif block:
                chunk = self._general(block)
            else:
                continue
            if chunk is None:   # a keep-alive, the [DONE] — or an unreadable event
                if self.failure is not None:
                    break
                continue
            self.events += 1
            if chunk.error:
                self.failure = stream_fault(Wire.OPENAI_CHAT, chunk.error, None)
                break
            if chunk.choices:
                choice = chunk.choices[0]
                delta = choice.delta
                if delta is not None:
                    if delta.reasoning is not None or delta.reasoning_content is not None:
                        reasoning = delta.reasoning if delta.reasoning is not None else delta.reasoning_content
                        if reasoning:
                            out.append(ReasoningDelta(reasoning))
                    if delta.content:
                        out.append(ModelDelta(delta.content))
                    if delta.tool_calls:
                        self._calls(delta.tool_calls, out)
                if choice.finish_reason:
                    self.finish_reason = choice.finish_reason
                    if self._open:
                        out += [ToolCallEnd(index) for index in sorted(self._open)]
                        self._open.clear()
            if chunk.usage is not None:
                self.usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        if self.failure is None and self._frames.oversized:
            self.failure = Fault("connection", OVERSIZED)
        return out

    def _calls(self, calls: list[_ToolCall], out: list[ModelOutput]) -> None:
        """A delta's call fragments: an index seen for the first time starts its call (its id and
        name come with it), every non-empty `arguments` fragment is the call's."""
        for call in calls:
            index, function = call.index, call.function
            if index not in self._open:
                self._open.append(index)
                self.calls += 1
                name = function.name if function is not None else None
                out.append(ToolCallStart(index, call.id or "", name or ""))
            if function is not None and function.arguments:
                out.append(ToolCallArgs(index, function.arguments))

    def _general(self, block: bytes) -> _Chunk | None:
        """A block in any other shape: its chunk; None for a keep-alive, the [DONE], or an event it
        cannot read (then `failure` is set)."""
        event = fields(block)
        if event is None:
            return None
        if event[1] == b"[DONE]":
            self.done = True
            return None
        try:
            return _decode_chunk(event[1])
        except msgspec.DecodeError as exc:
            self.failure = unreadable(exc)
            return None

    def end_reason(self) -> str | None:
        """The finish reason the stream ended with; None: it was cut (LiteLLM: "Stream ended before a
        finish_reason was received", an APIConnectionError)."""
        return self.finish_reason
