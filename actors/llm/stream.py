"""The single entry for every model call: ordered models, provider fallback, raw deltas out.

`stream_model` is the async iterator of model deltas the round engine consumes (docs/design.md#overview): it
yields `ModelDelta`s as the model streams them, a `ModelFallback` when a provider fails before its
first delta and the next model takes over (docs/design.md#fallback), and a final `ModelFinished`. An error
after the first delta is raised, never fallen back from: the user may already have seen part of
the answer, and salvage is the round's decision, made from its gates' counters.

Three readers serve an attempt, all yielding the same items and the same `ProviderError` kinds:
the fast path (`fast.py`) for the providers it reads, the direct player for `scripted/<name>`
(`_play_scripted`, docs/design.md#scripted-model: load tests and benches then measure reactgate, not
LiteLLM's per-chunk wrapper), and LiteLLM's own stream wrapper for every other call — or for any model
whose settings say `stream_reader = "litellm"`.

Every attempt — first model, fallbacks — takes a fresh call index from the conversation
(`next_call_index`), so the scripted model's "round i answers the i-th call" holds across
retries, continuations and fallbacks, and across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from actors.llm.deltas import ModelDelta, ModelFallback, ModelFinished, StreamItem
from actors.llm.errors import SILENCE, ProviderError, Usage, error_kind, error_message
from actors.llm.fast import (
    DEFAULT_TIMEOUT_S,
    STREAM_READER,
    FastFinish,
    FastItem,
    fast_path_supports,
    fast_stream,
    without_reader_setting,
)
from actors.llm.keys import MissingKey, call_kwargs, scrub
from actors.llm.lite import litellm_module, warm_up
from actors.llm.scripts import (
    CALL_INDEX_HEADER,
    CONVERSATION_HEADER,
    PROVIDER,
    RoundFailed,
    play,
    round_to_play,
)

# -- the call ------------------------------------------------------------------------------------


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


def _usage(chunk: Any) -> Usage | None:
    reported = getattr(chunk, "usage", None)
    if reported is None:
        return None
    return Usage(int(getattr(reported, "prompt_tokens", 0) or 0), int(getattr(reported, "completion_tokens", 0) or 0))



class _Silent(Exception):
    """The provider sent nothing for `idle_timeout_s` after the first delta."""


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
) -> AsyncGenerator[StreamItem, None]:
    """Stream one model answer, falling back along `models` while nothing has been delivered.

    `settings` maps a model to its completion parameters (a profile's `model_settings`,
    docs/design.md#model-settings); its key is read here, from the variable the settings name.
    `idle_timeout_s` bounds the wait for each chunk after the first delta: a provider that goes
    silent mid-answer cuts the stream (a `timeout` ProviderError after the first delta), which the
    turn continues like any other cut (docs/design.md#continuation). `include_usage` asks providers
    that can for the call's usage (`ModelFinished.usage`), read from the chunk after the finish
    chunk (see `lite.LEAN_SETTINGS` for its cost). Close it early (`aclose()`, or leave an `async with contextlib.aclosing(...)` block) to abort a
    generation: the reader's stream (HTTP response, LiteLLM stream, scripted playback) is closed with it.
    """
    if not models:
        raise ValueError("stream_model needs at least one model")
    for position, model in enumerate(models):
        # One call index per attempt, whichever reader serves it. It and the conversation travel as
        # headers: the scripted provider and the mock endpoint play from them; real providers
        # ignore unknown headers. The direct player takes the index as it is.
        call_index = next_call_index()
        headers = {CONVERSATION_HEADER: conversation_id, CALL_INDEX_HEADER: str(call_index)}
        own_settings = (settings or {}).get(model, {})
        attempt: AsyncGenerator[FastItem, None] | None = None
        if plays_directly(model, own_settings):
            attempt = _play_scripted(model, messages, call_index=call_index, settings=own_settings,
                                     timeout_s=timeout_s, idle_timeout_s=idle_timeout_s, include_usage=include_usage)
        elif fast_path_supports(model, own_settings, api_base=api_base):
            # docs/design.md#model-settings: LiteLLM builds the request, we read the stream (fast.py).
            attempt = fast_stream(
                model, messages, headers=headers, settings=own_settings, api_base=api_base, api_key=api_key,
                max_tokens=max_tokens, timeout_s=timeout_s, idle_timeout_s=idle_timeout_s,
                include_usage=include_usage,
            )
        if attempt is not None:
            finished: FastFinish | None = None
            try:
                async with contextlib.aclosing(attempt) as items:
                    async for item in items:
                        if isinstance(item, FastFinish):
                            finished = item
                        else:
                            yield item   # the reader's deltas, as they are
            except ProviderError as failed:
                if failed.after_first_delta or position + 1 == len(models):
                    raise
                yield _fallback(model, models[position + 1], failed)
                continue
            assert finished is not None  # an attempt always ends with its finish, or raises
            yield ModelFinished(finished.finish_reason, model, finished.usage)
            return
        litellm = litellm_module()
        if model.startswith(_SCRIPTED):
            from actors.llm.scripted import ensure_registered

            ensure_registered()   # the custom provider that plays it
        kwargs: dict[str, Any] = {
            "extra_headers": headers,
            # No hidden retries: each one would be a model call the conversation did not count.
            "max_retries": 0,
            "num_retries": 0,
        }
        if api_base is not None:
            kwargs["api_base"] = api_base
        if api_key is not None:
            kwargs["api_key"] = api_key
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        want_usage = include_usage and reports_usage(model)
        if want_usage:
            kwargs["stream_options"] = {"include_usage": True}

        delivered = False
        finish_reason: str | None = None
        usage: Usage | None = None
        stream: Any = None
        key: str | None = None
        try:
            own, key = call_kwargs(without_reader_setting(own_settings))
            kwargs.update(own)
            stream = await litellm.acompletion(model=model, messages=messages, stream=True, **kwargs)
            chunks = stream.__aiter__()
            while True:
                try:
                    async with asyncio.timeout(idle_timeout_s if delivered else None):
                        chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if finish_reason is not None:
                        break  # the answer is whole; only its usage never came
                    assert idle_timeout_s is not None   # no timeout without one
                    raise _Silent(SILENCE.format(idle_timeout_s)) from None
                if want_usage:
                    usage = _usage(chunk) or usage
                    if usage is not None and finish_reason is not None:
                        break  # the usage chunk, after the finish chunk: nothing more to read
                choices = chunk.choices
                if not choices:
                    continue
                choice = choices[0]
                text = choice.delta.content
                if text:
                    delivered = True
                    yield ModelDelta(text)
                if choice.finish_reason is not None:
                    finish_reason = choice.finish_reason
                    if not want_usage or usage is not None:
                        break  # see lite.LEAN_SETTINGS: do not drain into LiteLLM's end-of-stream rebuild
        except Exception as exc:
            if finish_reason is not None:  # failed after the finish chunk, reading the usage: the answer is whole
                yield ModelFinished(finish_reason, model, usage)
                return
            kind = "timeout" if isinstance(exc, _Silent) else "auth" if isinstance(exc, MissingKey) else error_kind(exc)
            error = ProviderError(kind, model, scrub(error_message(exc), key), after_first_delta=delivered)
            if delivered or position + 1 == len(models):
                # The provider's own exception may quote the key: chain it only when there is none.
                raise error from (exc if key is None else None)
            yield _fallback(model, models[position + 1], error)
            continue
        finally:
            if stream is not None:
                await stream.aclose()
        yield ModelFinished(finish_reason, model, usage)
        return


# -- the scripted model, played here ---------------------------------------------------------------

_SCRIPTED = f"{PROVIDER}/"


def plays_directly(model: str, settings: Mapping[str, Any]) -> bool:
    """Whether `stream_model` plays this model itself: a `scripted/<name>` model whose settings do not
    ask for LiteLLM's reader (`stream_reader = "litellm"` keeps the custom provider, scripted.py)."""
    return model.startswith(_SCRIPTED) and settings.get(STREAM_READER, "fast") == "fast"


async def _play_scripted(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    call_index: int,
    settings: Mapping[str, Any],
    timeout_s: float | None,
    idle_timeout_s: float | None,
    include_usage: bool,
) -> AsyncGenerator[FastItem, None]:
    """One attempt of `scripted/<name>` with no LiteLLM in between: what the custom provider streams
    through LiteLLM's wrapper for the same call — deltas, finish reason, usage when asked for — and its
    failures as the `ProviderError`s the LiteLLM path reports (kind, message, after_first_delta).

    As there, the settings' `timeout` wins over `timeout_s` (LiteLLM's 600 s when neither is given),
    and a settings key that names an unset variable fails with `auth`."""
    delivered = False
    try:
        call_kwargs(settings)
        timeout = settings.get("timeout", timeout_s)
        round_ = round_to_play(model[len(_SCRIPTED):], call_index, messages)
        read_timeout_s = DEFAULT_TIMEOUT_S if timeout is None else float(timeout)
        async with contextlib.aclosing(play(round_, read_timeout_s=read_timeout_s, idle_timeout_s=idle_timeout_s)) as texts:
            async for text in texts:
                if text:
                    delivered = True
                    yield ModelDelta(text)
    except RoundFailed as failed:
        raise ProviderError(failed.kind, model, failed.message, after_first_delta=delivered) from None
    except MissingKey as exc:
        raise ProviderError("auth", model, str(exc), after_first_delta=False) from None
    usage = round_.reported_usage(messages) if include_usage else None
    yield FastFinish(round_.finish_reason, None if usage is None else Usage(usage.prompt_tokens, usage.completion_tokens))


def _fallback(model: str, to: str, error: ProviderError) -> ModelFallback:
    """Moving on to the next model after `error`, before any delta: the one description both readers give."""
    described = error.message if error.message.startswith(error.kind) else f"{error.kind}: {error.message}"
    return ModelFallback(model, to, described)


__all__ = [
    "ModelDelta",
    "ModelFallback",
    "ModelFinished",
    "ProviderError",
    "StreamItem",
    "Usage",
    "plays_directly",
    "stream_model",
    "warm_up",
]
