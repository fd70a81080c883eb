"""The single entry for every model call: ordered models, provider fallback, model deltas out.

`stream_model` is the async iterator of model deltas the round engine consumes (docs/design.md#overview):
it yields the model's deltas as the model streams them (content, reasoning, native calls:
`protocol/deltas.py`), a `ModelFallback` when a provider fails before its
first delta and the next model takes over (docs/design.md#fallback), and a final `ModelFinished`. An
error after the first delta is raised, never fallen back from: the user may already have seen part
of the answer, and salvage is the round's decision, made from its gates' counters.

Each attempt is resolved once into a `ModelCall` (settings win over arguments, the key read at the
call) and served by one of `READERS`, all yielding the same items and the same `ProviderError` kinds.
Every attempt — first model, fallbacks — takes a fresh call index from the conversation
(`next_call_index`), so the scripted model's "round i answers the i-th call" holds across retries,
continuations and fallbacks, and across processes. Every failed attempt is reported to this
process's `failures.FAILURES`, which logs each (model, cause) once a minute.

This module is also where consumers take the model layer's vocabulary from: the items, `Usage`,
`ProviderError`, and `warm_up`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Final

from actors.llm.call import ModelCall
from actors.llm.deltas import ModelFallback, ModelFinished, StreamItem
from actors.llm.direct_player import play_directly, plays_directly
from actors.llm.errors import ProviderError, Usage
from actors.llm.failures import FAILURES
from actors.llm.fast import fast_stream
from actors.llm.lite import warm_up
from actors.llm.litellm_reader import litellm_stream
from actors.llm.request import fast_path_supports
from protocol.deltas import ModelDelta

Reader = Callable[[ModelCall], AsyncGenerator[StreamItem, None]]

# How an attempt is read (docs/design.md#model-settings), the first that fits; each row's reader
# is one attempt: its deltas, then its finish, or a ProviderError.
READERS: Final[Mapping[str, Reader]] = {
    "scripted": play_directly,   # `scripted/<name>`, played with no LiteLLM (docs/design.md#scripted-model)
    "fast": fast_stream,         # our SSE decoders, OpenAI-compatible or Anthropic (fast.DECODERS)
    "litellm": litellm_stream,   # LiteLLM's stream wrapper: any other call, or `stream_reader = "litellm"`
}


def reader_for(call: ModelCall) -> str:
    """The row of `READERS` that serves `call`."""
    if plays_directly(call):
        return "scripted"
    if fast_path_supports(call):
        return "fast"
    return "litellm"


async def stream_model(
    models: Sequence[str],
    messages: list[dict[str, Any]],
    *,
    conversation_id: str,
    next_call_index: Callable[[], int],
    api_base: str | None = None,
    api_key: str | None = None,
    max_tokens: int | None = None,
    timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    include_usage: bool = False,
    tools: Sequence[Mapping[str, Any]] = (),
) -> AsyncGenerator[StreamItem, None]:
    """Stream one model answer, falling back along `models` while nothing has been delivered.

    `settings` maps a model to its completion parameters (a profile's `model_settings`,
    docs/design.md#model-settings), which win over the arguments; its key is read at the call,
    from the variable the settings name. `idle_timeout_s` bounds the wait for each chunk after the
    first delta: a provider that goes silent mid-answer cuts the stream (a `timeout` ProviderError
    after the first delta), which the turn continues like any other cut (docs/design.md#continuation).
    `include_usage` asks providers that can for the call's usage (`ModelFinished.usage`), read from
    the chunk after the finish chunk (see `lite.LEAN_SETTINGS` for its cost). Close it early
    (`aclose()`, or leave an `async with contextlib.aclosing(...)` block) to abort a generation:
    the reader's stream (HTTP response, LiteLLM stream, scripted playback) is closed with it.
    `tools`: the functions a native round offers (docs/design.md#native), in OpenAI's shape.
    """
    if not models:
        raise ValueError("stream_model needs at least one model")
    for position, model in enumerate(models):
        try:
            call = ModelCall.resolve(
                model, messages, (settings or {}).get(model, {}), conversation_id=conversation_id,
                call_index=next_call_index(), api_base=api_base, api_key=api_key, max_tokens=max_tokens,
                timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, include_usage=include_usage, tools=tools,
            )
            async with contextlib.aclosing(READERS[reader_for(call)](call)) as items:
                async for item in items:
                    yield item
            return
        except ProviderError as failed:
            FAILURES.failed(failed, conversation_id)   # once per (model, cause) a minute
            if failed.after_first_delta or position + 1 == len(models):
                raise
            yield _fallback(model, models[position + 1], failed)


def _fallback(model: str, to: str, error: ProviderError) -> ModelFallback:
    """Moving on to the next model after `error`, before any delta: one description for every reader."""
    described = error.message if error.message.startswith(error.kind) else f"{error.kind}: {error.message}"
    return ModelFallback(model, to, described)


__all__ = [
    "READERS",
    "ModelDelta",
    "ModelFallback",
    "ModelFinished",
    "ProviderError",
    "StreamItem",
    "Usage",
    "reader_for",
    "stream_model",
    "warm_up",
]
