"""What `reactgate mock-llm` writes on each wire (docs/design.md#scripted-model): a round's deltas in,
the provider's bytes out — no socket, no event loop.

One encoder per response, per wire, fed the round's stream (`Round.stream`) as `scripts.play` paces
it: `start()`, `delta()` for each delta, then `finish()` or `error()`. The shapes are the providers'
own (docs/design.md#native; the table is docs/design.md#scripted-model's):

| delta | OpenAI chat completions SSE | Anthropic Messages SSE |
|---|---|---|
| content | `delta.content` | a `text` block, `text_delta` |
| reasoning | `delta.reasoning_content` | a `thinking` block, `thinking_delta` |
| signature | nothing (no such field) | `signature_delta`, which closes the thinking block |
| redacted | nothing (no such field) | a `redacted_thinking` block |
| call start | `delta.tool_calls[{index, id, type, function: {name, arguments: ""}}]` | a `tool_use` block (id, name, `input: {}`) |
| call arguments | `delta.tool_calls[{index, function: {arguments}}]` | `input_json_delta` |
| call end | nothing: a reader ends a call at the next one or the finish | `content_block_stop` |
| finish | a chunk with `finish_reason`; with `include_usage`, a usage chunk; `[DONE]` | `message_delta` (`stop_reason`, usage), `message_stop` |
| error | `event: error` with OpenAI's error object | an `error` event with Anthropic's |

A block left open when the stream fails stays open: a provider failing mid-call never closes it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from actors.llm.errors import ErrorKind
from actors.llm.scripts import Round, RoundUsage
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

# A mid-stream error arrives inside a 200 stream, so a reader can only classify it by its text
# (`errors.TEXT_RULES`, LiteLLM's `exception_mapping_utils`). These messages make it land on the same
# kind as the custom provider where the wire allows: on OpenAI's, kinds a real provider never reports
# mid-stream (auth, not_found, unavailable) come back as `connection`; on Anthropic's, an error event
# is a 500, so only `timeout` keeps its kind and every other kind comes back as `server_error`.
MID_STREAM_MESSAGES: Final[Mapping[ErrorKind, str]] = {
    ErrorKind.RATE_LIMIT: "Rate limit reached (429)",
    ErrorKind.TIMEOUT: "A timeout occurred",
    ErrorKind.SERVER_ERROR: "The server had an error processing your request.",
    ErrorKind.BAD_REQUEST: "invalid_request_error",
}
ANTHROPIC_MID_STREAM_MESSAGES: Final[Mapping[ErrorKind, str]] = {ErrorKind.TIMEOUT: "Request timed out"}

# Anthropic's error types, by the status a scripted error is answered with (`errors.ERROR_TABLE`).
# Not `overloaded_error` for `unavailable`: its text reads as `server_error` (errors.TEXT_RULES).
ANTHROPIC_ERROR_TYPES: Final[Mapping[ErrorKind, str]] = {
    ErrorKind.RATE_LIMIT: "rate_limit_error",
    ErrorKind.TIMEOUT: "timeout_error",
    ErrorKind.SERVER_ERROR: "api_error",
    ErrorKind.UNAVAILABLE: "api_error",
    ErrorKind.BAD_REQUEST: "invalid_request_error",
    ErrorKind.AUTH: "authentication_error",
    ErrorKind.NOT_FOUND: "not_found_error",
}
# OpenAI's finish reasons in Anthropic's words (LiteLLM's `map_finish_reason` reads them back).
STOP_REASONS: Final[Mapping[str, str]] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal",
}


def openai_error(message: str, type_: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def anthropic_error(message: str, type_: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


def _json(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


class Encoder(Protocol):
    def start(self) -> bytes: ...
    def delta(self, delta: ModelOutput) -> bytes: ...
    def finish(self, finish_reason: str, usage: RoundUsage | None) -> bytes: ...
    def error(self, kind: ErrorKind) -> bytes: ...


def _usage(usage: RoundUsage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


# -- OpenAI chat completions -------------------------------------------------------------------------


class OpenAIChatEncoder:
    """One streamed chat completion: `data: {chunk}` events, then `data: [DONE]`."""

    def __init__(self, model: str) -> None:
        self._base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
                      "created": int(time.time()), "model": model}
        self._first = True

    def start(self) -> bytes:
        return b""

    def delta(self, delta: ModelOutput) -> bytes:
        fields = _openai_delta(delta)
        if fields is None:
            return b""
        if self._first:
            fields = {"role": "assistant", **fields}
            self._first = False
        return self._chunk([{"index": 0, "delta": fields, "finish_reason": None}])

    def finish(self, finish_reason: str, usage: RoundUsage | None) -> bytes:
        out = self._chunk([{"index": 0, "delta": {}, "finish_reason": finish_reason}])
        if usage is not None:  # `stream_options.include_usage`: one more chunk, no choices, as OpenAI sends it
            out += self._chunk([], usage=_usage(usage))
        return out + b"data: [DONE]\n\n"

    def error(self, kind: ErrorKind) -> bytes:
        # A provider failing mid-stream: OpenAI sends an error event inside the 200 stream.
        message = f"{MID_STREAM_MESSAGES.get(kind, '')} scripted {kind.value}".lstrip()
        return b"event: error\ndata: " + _json({"error": {"message": message, "type": kind.value,
                                                           "code": kind.value}}).encode() + b"\n\n"

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return ("data: " + _json({**self._base, "choices": choices, **extra}) + "\n\n").encode()


def _openai_delta(delta: ModelOutput) -> dict[str, Any] | None:
    match delta:
        case ModelDelta(text=text):
            return {"content": text}
        case ReasoningDelta(text=text):
            return {"reasoning_content": text}
        case ToolCallStart(index=index, call_id=call_id, name=name):
            return {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                                    "function": {"name": name, "arguments": ""}}]}
        case ToolCallArgs(index=index, fragment=fragment):
            return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
    return None   # a call's end, a signature, a redacted block: the wire has no field for them


def openai_completion(model: str, round_: Round, usage: RoundUsage) -> dict[str, Any]:
    """The whole round as one (non-streamed) chat completion."""
    content = "".join(round_.chunks)
    message: dict[str, Any] = {"role": "assistant", "content": content or None if round_.native else content}
    reasoning = "".join(d.text for d in round_.stream if type(d) is ReasoningDelta)
    if reasoning:
        message["reasoning_content"] = reasoning
    starts = [d for d in round_.stream if type(d) is ToolCallStart]
    if starts:
        message["tool_calls"] = [{"id": d.call_id, "type": "function",
                                  "function": {"name": d.name, "arguments": call.arguments_text}}
                                 for d, call in zip(starts, round_.calls, strict=True)]
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": round_.finish_reason, "message": message}],
            "usage": _usage(usage)}


# -- Anthropic Messages ------------------------------------------------------------------------------


class AnthropicMessagesEncoder:
    """One streamed message: `event: <type>` + `data: {…}` events, one content block at a time."""

    def __init__(self, model: str, usage: RoundUsage) -> None:
        self._model = model
        self._usage = usage
        self._index = -1
        self._open: str | None = None   # the type of the block being streamed

    def start(self) -> bytes:
        message: dict[str, Any] = {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
                   "model": self._model, "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self._usage.prompt_tokens, "output_tokens": 1}}
        return _event("message_start", {"message": message}) + _event("ping", {})

    def delta(self, delta: ModelOutput) -> bytes:
        match delta:
            case ModelDelta(text=text):
                if not text:
                    return b""
                return self._into("text", {"type": "text", "text": ""}) + self._delta({"type": "text_delta", "text": text})
            case ReasoningDelta(text=text):
                opened = self._into("thinking", {"type": "thinking", "thinking": ""})
                return opened + self._delta({"type": "thinking_delta", "thinking": text})
            case ReasoningSignature(signature=signature):
                opened = self._into("thinking", {"type": "thinking", "thinking": ""})
                return opened + self._delta({"type": "signature_delta", "signature": signature}) + self._close()
            case RedactedReasoning(data=data):
                return self._close() + self._open_block({"type": "redacted_thinking", "data": data}) + self._close()
            case ToolCallStart(call_id=call_id, name=name):
                return self._close() + self._open_block({"type": "tool_use", "id": call_id, "name": name, "input": {}})
            case ToolCallArgs(fragment=fragment):
                return self._delta({"type": "input_json_delta", "partial_json": fragment})
            case ToolCallEnd():
                return self._close()
        return b""

    def finish(self, finish_reason: str, usage: RoundUsage | None) -> bytes:
        done = {"stop_reason": STOP_REASONS[finish_reason], "stop_sequence": None}
        return (self._close()
                + _event("message_delta", {"delta": done, "usage": {"output_tokens": self._usage.completion_tokens}})
                + _event("message_stop", {}))

    def error(self, kind: ErrorKind) -> bytes:
        message = f"{ANTHROPIC_MID_STREAM_MESSAGES.get(kind, 'Internal server error')} (scripted {kind.value})"
        return _event("error", {"error": {"type": "api_error", "message": message}})

    def _into(self, kind: str, block: dict[str, Any]) -> bytes:
        """Open a block of `kind` unless one is open already."""
        return b"" if self._open == kind else self._close() + self._open_block(block)

    def _open_block(self, block: dict[str, Any]) -> bytes:
        self._index += 1
        self._open = block["type"]
        return _event("content_block_start", {"index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return _event("content_block_stop", {"index": self._index})


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {_json({'type': name, **data})}\n\n".encode()


def anthropic_blocks(stream: Sequence[ModelOutput]) -> list[dict[str, Any]]:
    """A round's content blocks, whole, as a non-streamed message holds them."""
    blocks: list[dict[str, Any]] = []
    for d in stream:
        last = blocks[-1] if blocks else None
        match d:
            case ModelDelta(text=text) if text:
                if last is not None and last["type"] == "text":
                    last["text"] += text
                else:
                    blocks.append({"type": "text", "text": text})
            case ReasoningDelta(text=text):
                if last is not None and last["type"] == "thinking" and "signature" not in last:
                    last["thinking"] += text
                else:
                    blocks.append({"type": "thinking", "thinking": text})
            case ReasoningSignature(signature=signature):
                if last is None or last["type"] != "thinking" or "signature" in last:
                    blocks.append(last := {"type": "thinking", "thinking": ""})
                last["signature"] = signature
            case RedactedReasoning(data=data):
                blocks.append({"type": "redacted_thinking", "data": data})
            case ToolCallStart(call_id=call_id, name=name):
                blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": ""})
            case ToolCallArgs(fragment=fragment) if last is not None and last["type"] == "tool_use":
                last["input"] += fragment
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = _object(block["input"])
    return blocks


def _object(arguments: str) -> Any:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def anthropic_message(model: str, round_: Round, usage: RoundUsage) -> dict[str, Any]:
    """The whole round as one (non-streamed) Messages API answer."""
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
            "content": anthropic_blocks(round_.stream), "stop_reason": STOP_REASONS[round_.finish_reason],
            "stop_sequence": None,
            "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}}
