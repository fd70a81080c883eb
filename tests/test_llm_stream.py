"""`stream_model` — the single entry for model calls: deltas, provider fallback, errors (docs/design.md#continuation)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import pytest

from actors.llm.scripts import ErrorKind, Round, Script, register_script
from actors.llm.stream import (
    LEAN_SETTINGS,
    ModelDelta,
    ModelFallback,
    ModelFinished,
    ProviderError,
    StreamItem,
    litellm_module,
    stream_model,
)

MESSAGES = [{"role": "user", "content": "hi"}]


class Counter:
    """The conversation's durable call counter, as the conversation would hand it over."""

    def __init__(self, start: int = 0) -> None:
        self._it = itertools.count(start)
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return next(self._it)


async def collect(models: list[str], counter: Callable[[], int] | None = None, **kw: Any) -> list[StreamItem]:
    return [
        item
        async for item in stream_model(
            models, MESSAGES, conversation_id="conv", next_call_index=counter or Counter(), **kw
        )
    ]


def texts(items: list[StreamItem]) -> str:
    return "".join(i.text for i in items if isinstance(i, ModelDelta))


async def test_deltas_then_finished_last() -> None:
    model = register_script("s-basic", Script(rounds=[Round(text="Hello world", finish_reason="length")]))
    items = await collect([model])
    assert items == [ModelDelta("Hell"), ModelDelta("o wo"), ModelDelta("rld"), ModelFinished("length", model)]


async def test_empty_text_chunks_are_skipped() -> None:
    model = register_script("s-empty", Script(rounds=[Round(deltas=["", "a", "", "b", ""])]))
    assert await collect([model]) == [ModelDelta("a"), ModelDelta("b"), ModelFinished("stop", model)]


async def test_provider_error_before_first_delta_falls_back_to_the_next_model() -> None:
    failing = register_script("s-fail", Script(rounds=[Round(error=ErrorKind.RATE_LIMIT)]))
    # The fallback call is the conversation's call #1, so it plays round 1 of its script.
    backup = register_script("s-backup", Script(rounds=[Round(text="not me"), Round(text="from backup")]))
    counter = Counter()
    items = await collect([failing, backup], counter)
    assert isinstance(items[0], ModelFallback)
    assert (items[0].from_model, items[0].to_model) == (failing, backup)
    assert items[0].error.startswith("rate_limit")
    assert texts(items) == "from backup"
    assert items[-1] == ModelFinished("stop", backup)
    assert counter.calls == 2  # one call index per attempt, fallbacks included


async def test_every_model_failing_before_first_delta_raises_provider_error() -> None:
    a = register_script("s-a", Script(rounds=[Round(error=ErrorKind.SERVER_ERROR)], loop=True))
    b = register_script("s-b", Script(rounds=[Round(error=ErrorKind.AUTH)], loop=True))
    seen: list[StreamItem] = []
    with pytest.raises(ProviderError) as err:
        async for item in stream_model([a, b], MESSAGES, conversation_id="c", next_call_index=Counter()):
            seen.append(item)
    assert [type(i) for i in seen] == [ModelFallback]
    assert (err.value.kind, err.value.model, err.value.after_first_delta) == ("auth", b, False)


async def test_error_after_first_delta_raises_without_fallback() -> None:
    broken = register_script("s-mid", Script(rounds=[Round(deltas=["par", "tial"], error=ErrorKind.SERVER_ERROR)]))
    backup = register_script("s-unused", Script(rounds=[Round(text="never")], loop=True))
    seen: list[StreamItem] = []
    counter = Counter()
    with pytest.raises(ProviderError) as err:
        async for item in stream_model([broken, backup], MESSAGES, conversation_id="c", next_call_index=counter):
            seen.append(item)
    assert seen == [ModelDelta("par"), ModelDelta("tial")]
    assert err.value.after_first_delta is True
    assert (err.value.kind, err.value.model) == ("server_error", broken)
    assert counter.calls == 1  # the backup was never called: salvage is the caller's


async def test_150_identical_deltas_pass() -> None:
    model = register_script("s-same", Script(rounds=[Round(deltas=["same"] * 150)]))
    items = await collect([model])
    assert items[:-1] == [ModelDelta("same")] * 150
    assert items[-1] == ModelFinished("stop", model)


async def test_litellm_repetition_guard_would_fire_without_the_lean_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shows the test above exercises the guard: at LiteLLM's default limit the same stream fails."""
    litellm = litellm_module()
    assert LEAN_SETTINGS["REPEATED_STREAMING_CHUNK_LIMIT"] == litellm.REPEATED_STREAMING_CHUNK_LIMIT
    monkeypatch.setattr(litellm, "REPEATED_STREAMING_CHUNK_LIMIT", 100)
    model = register_script("s-same-default", Script(rounds=[Round(deltas=["same"] * 150)]))
    with pytest.raises(ProviderError) as err:
        await collect([model])
    assert err.value.after_first_delta is True
    assert "repeating the same chunk" in err.value.message


async def test_closing_early_closes_the_litellm_stream_and_the_provider() -> None:
    from actors.llm.scripted import provider

    model = register_script("s-abort", Script(rounds=[Round(text="y" * 5000, chunk_chars=1)]))
    got = []
    async with aclosing(stream_model([model], MESSAGES, conversation_id="c", next_call_index=Counter())) as gen:
        async for item in gen:
            got.append(item)
            if len(got) == 3:
                assert provider().open_streams == 1
                break
    assert provider().open_streams == 0  # the prefix policy's abort really stops the generation
    assert got == [ModelDelta("y")] * 3


async def test_timeout_before_first_delta_falls_back() -> None:
    slow = register_script("s-slow", Script(rounds=[Round(deltas=["late"], delay_ms=5000)]))
    fast = register_script("s-fast", Script(rounds=[Round(text="x"), Round(text="in time")]))
    items = await collect([slow, fast], timeout_s=0.05)
    assert isinstance(items[0], ModelFallback) and items[0].error.startswith("timeout")
    assert texts(items) == "in time"


async def test_exhausted_script_is_a_provider_error_of_kind_script_exhausted() -> None:
    model = register_script("s-once", Script(rounds=[Round(text="once")]))
    with pytest.raises(ProviderError) as err:
        await collect([model], Counter(start=1))
    assert err.value.kind == "script_exhausted"


async def test_no_models_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        await collect([])


def test_lean_settings_are_applied_once_litellm_is_loaded() -> None:
    litellm = litellm_module()
    for key, value in LEAN_SETTINGS.items():
        assert getattr(litellm, key) == value, key
    assert litellm.disable_token_counter is False  # context assembly counts tokens with LiteLLM
