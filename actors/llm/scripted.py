"""The scripted model as a LiteLLM custom provider: `scripted/<name>` plays script <name> (docs/design.md#scripted-model).

`stream_model` plays scripts itself (`direct_player.py`, no LiteLLM per chunk); this provider serves
a model whose settings say `stream_reader = "litellm"` (`litellm_reader.py` registers it), and any
plain `litellm.acompletion` call once `ensure_registered()` has run —
through the real LiteLLM streaming path (`acompletion(stream=True)` → `CustomStreamWrapper`), so
tests of that path exercise what a real provider exercises. Both players pace and fail through
`scripts.play`, and `tests/test_llm_stream.py` checks they stream the same.

A native round (docs/design.md#native) goes through LiteLLM's wrapper as LiteLLM's own providers
put it: content and calls as `GenericStreamingChunk`s (`tool_use`: by index, id and name in a
call's first fragment, then its arguments); reasoning, signatures and redacted blocks as the
`ModelResponseStream` deltas LiteLLM's Anthropic provider yields (`reasoning_content`,
`thinking_blocks`) — a `GenericStreamingChunk` has no field for them, and the wrapper passes a
custom provider's `ModelResponseStream` through as it is. What this path cannot carry: a call's end
(`ToolCallEnd`), for which an OpenAI-shaped chunk has no field — a reader ends a call at the next
call or the finish, so a round cut right after a call's last fragment reads as cut mid-call.

The provider keeps no call counter of its own: the caller sends the conversation id and the
call index (`X-Reactgate-*` headers, see `scripts.py`) because the conversation owns the durable
counter and may resume in another process after a crash. A per-process counter is only the
fallback for callers that send no index.

This module is LiteLLM code: importing it loads LiteLLM (`lite.litellm_module()`), so the model
layer imports it only where a scripted model is played through LiteLLM (`litellm_reader.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from actors.llm.errors import ERROR_TABLE, ErrorKind
from actors.llm.lite import litellm_module, litellm_part
from actors.llm.scripts import (
    PROVIDER,
    CallCounter,
    Round,
    RoundFailed,
    RoundUsage,
    play,
    playback_position,
    round_to_play,
)
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    ToolCallArgs,
    ToolCallStart,
)

if TYPE_CHECKING:
    from litellm.llms.custom_llm import CustomLLM
    from litellm.types.utils import (
        Delta,
        GenericStreamingChunk,
        ModelResponse,
        ModelResponseStream,
        StreamingChoices,
    )
else:
    CustomLLM = litellm_part("llms.custom_llm").CustomLLM
    _types = litellm_part("types.utils")
    Delta, ModelResponseStream, StreamingChoices = _types.Delta, _types.ModelResponseStream, _types.StreamingChoices

litellm: Any = litellm_module()


def provider_exception(kind: ErrorKind, model: str, message: str) -> Exception:
    """The LiteLLM exception a real provider would raise for `kind` (one table: ERROR_TABLE)."""
    cls = getattr(litellm.exceptions, ERROR_TABLE[kind][1])
    return cls(message=message, model=model, llm_provider=PROVIDER)  # type: ignore[no-any-return]


def _chunk(text: str, finish_reason: str | None = None, usage: RoundUsage | None = None,
           tool_use: Any = None) -> GenericStreamingChunk:
    return {
        "text": text,
        "is_finished": finish_reason is not None,
        "finish_reason": finish_reason or "",
        # On the finish chunk, as providers report it; LiteLLM hands it out only when asked
        # (`stream_options.include_usage`) and drops it otherwise.
        "usage": None if usage is None else {
            "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
        "index": 0,
        "tool_use": tool_use,
    }


def _tool_use(index: int, call_id: str | None, name: str | None, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}, "index": index}


def _reasoning(**delta: Any) -> ModelResponseStream:
    return ModelResponseStream(choices=[StreamingChoices(index=0, delta=Delta(**delta))])


def _provider_chunk(delta: ModelOutput) -> GenericStreamingChunk | ModelResponseStream | None:
    """The chunk a provider yields for `delta`, in the shapes LiteLLM's own providers use; None for
    a call's end, which no chunk carries (see the module's docstring)."""
    match delta:
        case ModelDelta(text=text):
            return _chunk(text)
        case ToolCallStart(index=index, call_id=call_id, name=name):
            return _chunk("", tool_use=_tool_use(index, call_id, name, ""))
        case ToolCallArgs(index=index, fragment=fragment):
            return _chunk("", tool_use=_tool_use(index, None, None, fragment))
        case ReasoningDelta(text=text):
            return _reasoning(reasoning_content=text)
        case ReasoningSignature(signature=signature):
            return _reasoning(thinking_blocks=[{"type": "thinking", "thinking": "", "signature": signature}])
        case RedactedReasoning(data=data):
            return _reasoning(thinking_blocks=[{"type": "redacted_thinking", "data": data}])
    return None


def _read_timeout(timeout: Any) -> float | None:
    """The per-read timeout a real HTTP provider would apply, from LiteLLM's `timeout` argument."""
    if isinstance(timeout, int | float):
        return float(timeout)
    read = getattr(timeout, "read", None)  # httpx.Timeout
    return float(read) if isinstance(read, int | float) else None


class ScriptedLLM(CustomLLM):
    def __init__(self) -> None:
        super().__init__()
        self._fallback_counter = CallCounter()

    def resolve(self, model: str, headers: Mapping[str, str] | None, messages: list[Any]) -> Round:
        conversation, index = playback_position(headers)
        if index is None:
            index = self._fallback_counter.next(conversation or "")
        try:
            return round_to_play(model, index, messages)
        except RoundFailed as failed:
            raise provider_exception(failed.error, model, failed.message) from None

    async def astreaming(  # type: ignore[override, misc]
        self,
        model: str,
        messages: list[Any],
        api_base: str,
        custom_prompt_dict: dict[str, Any],
        model_response: ModelResponse,
        print_verbose: Callable[..., Any],
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict[str, Any],
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict[str, str] | None = None,
        timeout: Any = None,
        client: Any = None,
    ) -> AsyncIterator[GenericStreamingChunk | ModelResponseStream]:
        # An async generator: nothing runs until LiteLLM asks for the first chunk, so an `error`
        # round raises before any chunk, as a failing provider does. The idle timeout is not the
        # provider's: LiteLLM's reader keeps it around LiteLLM's stream.
        round_ = self.resolve(model, headers, messages)
        try:
            async with contextlib.aclosing(play(round_, read_timeout_s=_read_timeout(timeout))) as deltas:
                async for delta in deltas:
                    chunk = _provider_chunk(delta)
                    if chunk is not None:
                        yield chunk
        except RoundFailed as failed:
            raise provider_exception(failed.error, model, failed.message) from None
        yield _chunk("", round_.finish_reason, round_.reported_usage(messages))

    async def acompletion(
        self,
        model: str,
        messages: list[Any],
        api_base: str,
        custom_prompt_dict: dict[str, Any],
        model_response: ModelResponse,
        print_verbose: Callable[..., Any],
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict[str, Any],
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict[str, str] | None = None,
        timeout: Any = None,
        client: Any = None,
    ) -> ModelResponse:
        round_ = self.resolve(model, headers, messages)
        if round_.delay_ms:
            await asyncio.sleep(round_.delay_s * max(1, len(round_.stream)))
        if round_.error is not None:
            raise provider_exception(round_.error, model, f"scripted {round_.error.value}")
        message = model_response.choices[0].message
        message.content = "".join(round_.chunks)
        if round_.native is not None:
            tool_call = litellm_part("types.utils").ChatCompletionMessageToolCall
            message.tool_calls = [
                tool_call(id=d.call_id, type="function", function={"name": d.name, "arguments": call.arguments_text})
                for d, call in zip((d for d in round_.stream if type(d) is ToolCallStart), round_.calls, strict=False)
            ] or None
            reasoning = "".join(d.text for d in round_.stream if type(d) is ReasoningDelta)
            message.reasoning_content = reasoning or None
        model_response.choices[0].finish_reason = round_.finish_reason
        model_response.created = int(time.time())
        model_response.model = model
        return model_response


_provider: ScriptedLLM | None = None


def ensure_registered() -> ScriptedLLM:
    """Register provider `scripted` in `litellm.custom_provider_map` (idempotent; cheap to repeat).

    Returns the process's provider instance."""
    global _provider
    for entry in litellm.custom_provider_map:
        handler = entry.get("custom_handler")
        if entry.get("provider") == PROVIDER and isinstance(handler, ScriptedLLM):
            _provider = handler
            break
    else:
        _provider = _provider or ScriptedLLM()
        litellm.custom_provider_map = [
            *(e for e in litellm.custom_provider_map if e.get("provider") != PROVIDER),
            {"provider": PROVIDER, "custom_handler": _provider},
        ]
    if PROVIDER not in litellm._custom_providers or PROVIDER not in litellm.provider_list:
        litellm_part("utils").custom_llm_setup()
    return _provider


def provider() -> ScriptedLLM:
    """The process's scripted provider (registered with LiteLLM)."""
    return ensure_registered()
