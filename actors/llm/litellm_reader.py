"""LiteLLM's own stream wrapper, read: the reader for every call the fast path does not make.

That is any provider outside `wires.PROVIDER_WIRES`, any setting the fast path does not send, and
any model whose settings say `stream_reader = "litellm"` (docs/design.md#model-settings) — the
scripted model included, then played by LiteLLM's custom provider (`scripted.py`). It yields what
the other readers yield and fails with the same kinds (`errors.error_kind`), in LiteLLM's lean
configuration (`lite.LEAN_SETTINGS`), with no hidden retries: every attempt is one counted call
(docs/design.md#fallback).

A chunk's delta is read as the whole family of model deltas (docs/design.md#native), in the fast
reader's order: `reasoning_content` → `ReasoningDelta` (LiteLLM maps `reasoning` and Anthropic
thinking there); `thinking_blocks` → `ReasoningSignature` for an entry with a signature,
`RedactedReasoning` for a `redacted_thinking` one (LiteLLM streams Anthropic's signature_delta and
redacted blocks as one-entry lists); `content` → `ModelDelta`; `tool_calls[]` by index →
`ToolCallStart` at an index's first fragment, `ToolCallArgs` per non-empty `arguments` fragment;
the finish reason ends every started call (`ToolCallEnd`, in index order), as the fast reader does.

What LiteLLM's wrapper cannot carry (tests/test_llm_native.py pins each):
- Anthropic's `content_block_stop`: a tool_use block's end is not in its chunks, so a call ends at
  the finish, as on the OpenAI wire — same calls, same arguments, closed later (after any content
  the message has after them);
- what an Anthropic start block already holds other than text — a tool_use block's non-empty
  `input`, a thinking block's `thinking` or `signature` — is dropped by LiteLLM's Anthropic
  iterator (Anthropic streams them empty; the fast reader keeps them);
- a tool_use block that streamed no `input_json_delta` at all gets no arguments (the fast reader
  writes the `{}` its start block gave; the native decoder reads no arguments as `{}` too).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator
from typing import Any

from actors.llm.call import ModelCall
from actors.llm.deltas import ModelFinished, StreamItem
from actors.llm.errors import SILENCE, ProviderError, Usage, error_kind, error_message
from actors.llm.keys import scrub
from actors.llm.lite import litellm_module
from actors.llm.providers import no_provider, provider_of
from actors.llm.scripts import PROVIDER
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


class _Silent(Exception):
    """The provider sent nothing for the idle timeout after the first delta."""


@functools.lru_cache(maxsize=256)
def reports_usage(model: str) -> bool:
    """Whether LiteLLM passes `stream_options` to this model's provider (then it reports usage)."""
    litellm = litellm_module()
    try:
        _, provider, _, _ = litellm.get_llm_provider(model)
        params = litellm.get_supported_openai_params(model=model, custom_llm_provider=provider) or ()
    except Exception:
        return False
    return "stream_options" in params


def _deltas(delta: Any, started: list[int]) -> list[ModelOutput]:
    """One LiteLLM delta as model deltas (`started`: the indices of the calls started so far)."""
    out: list[ModelOutput] = []
    reasoning = getattr(delta, "reasoning_content", None)
    if reasoning:
        out.append(ReasoningDelta(reasoning))
    for block in getattr(delta, "thinking_blocks", None) or ():
        if block.get("type") == "redacted_thinking":
            out.append(RedactedReasoning(block.get("data") or ""))
        elif block.get("signature"):
            out.append(ReasoningSignature(block["signature"]))
    if delta.content:
        out.append(ModelDelta(delta.content))
    for call in delta.tool_calls or ():
        function = call.function
        if call.index not in started:
            started.append(call.index)
            out.append(ToolCallStart(call.index, call.id or "", (function.name if function is not None else None) or ""))
        if function is not None and function.arguments:
            out.append(ToolCallArgs(call.index, function.arguments))
    return out


def _usage(chunk: Any) -> Usage | None:
    reported = getattr(chunk, "usage", None)
    if reported is None:
        return None
    return Usage(int(getattr(reported, "prompt_tokens", 0) or 0), int(getattr(reported, "completion_tokens", 0) or 0))


async def litellm_stream(call: ModelCall) -> AsyncGenerator[StreamItem, None]:
    """One model attempt through `litellm.acompletion(stream=True)`: deltas, then its finish; or a
    `ProviderError`. The wrapper is left at the finish chunk (or at the usage chunk after it, when
    usage is asked for and the provider reports it) and closed: see `lite.LEAN_SETTINGS`."""
    litellm = litellm_module()
    if call.model.startswith(f"{PROVIDER}/"):
        from actors.llm.scripted import ensure_registered

        ensure_registered()   # the custom provider that plays it
    elif provider_of(call.model, call.api_base) is None:   # LiteLLM would refuse it with a page of advice
        raise ProviderError("bad_request", call.model, no_provider(call.model), after_first_delta=False)
    want_usage = call.include_usage and reports_usage(call.model)
    kwargs: dict[str, Any] = {"extra_headers": call.headers, "max_retries": 0, "num_retries": 0}
    if call.api_base is not None:
        kwargs["api_base"] = call.api_base
    if call.api_key is not None:
        kwargs["api_key"] = call.api_key
    if call.timeout is not None:
        kwargs["timeout"] = call.timeout
    if want_usage:
        kwargs["stream_options"] = {"include_usage": True}
    if call.tools:
        kwargs["tools"] = list(call.tools)
    kwargs.update(call.params)   # the model's own parameters, as the profile gave them

    delivered = False
    finish_reason: str | None = None
    usage: Usage | None = None
    stream: Any = None
    started: list[int] = []   # the calls started, by index: each ends at the finish
    try:
        stream = await litellm.acompletion(model=call.model, messages=call.messages, stream=True, **kwargs)
        chunks = stream.__aiter__()
        while True:
            try:
                async with asyncio.timeout(call.idle_timeout_s if delivered else None):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                if finish_reason is not None:
                    break  # the answer is whole; only its usage never came
                assert call.idle_timeout_s is not None   # no timeout without one
                raise _Silent(SILENCE.format(call.idle_timeout_s)) from None
            if want_usage:
                usage = _usage(chunk) or usage
                if usage is not None and finish_reason is not None:
                    break  # the usage chunk, after the finish chunk: nothing more to read
            choices = chunk.choices
            if not choices:
                continue
            choice = choices[0]
            for delta in _deltas(choice.delta, started):
                delivered = True
                yield delta
            if choice.finish_reason is not None:
                finish_reason = choice.finish_reason
                for index in sorted(started):
                    yield ToolCallEnd(index)
                started.clear()
                if not want_usage or usage is not None:
                    break  # see LEAN_SETTINGS: do not drain into LiteLLM's end-of-stream rebuild
    except Exception as exc:
        if finish_reason is None:
            kind = "timeout" if isinstance(exc, _Silent) else error_kind(exc)
            error = ProviderError(kind, call.model, scrub(error_message(exc), call.api_key), after_first_delta=delivered)
            # The provider's own exception may quote the key: chain it only when there is none.
            raise error from (exc if call.api_key is None else None)
        # failed after the finish chunk, reading the usage: the answer is whole
    finally:
        if stream is not None:
            await stream.aclose()
    yield ModelFinished(finish_reason, call.model, usage)
