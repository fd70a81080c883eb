"""`stream_model` — the single entry for model calls: deltas, provider fallback, errors (docs/design.md#continuation).

Scripted models are played two ways (docs/design.md#scripted-model): directly by `stream_model` (the
default) and through LiteLLM's custom provider (`stream_reader = "litellm"`). The tests marked
"both readers" run on each; the equivalence tests check the two give the same items and errors.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from contextlib import aclosing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.llm.call import ModelCall
from actors.llm.direct_player import plays_directly
from actors.llm.errors import ErrorKind, Usage
from actors.llm.lite import LEAN_SETTINGS, litellm_module
from actors.llm.scripts import Round, RoundUsage, Script, open_playbacks, parse_script, register_script
from actors.llm.stream import (
    ModelDelta,
    ModelFallback,
    ModelFinished,
    ProviderError,
    StreamItem,
    stream_model,
)
from protocol.deltas import ModelOutput, ReasoningSignature, ToolCallArgs, ToolCallEnd, ToolCallStart
from tests.fixtures.native_sse import ends_at_the_finish

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


READERS = ("direct", "litellm")


def reader_settings(reader: str, *models: str, **own: Any) -> dict[str, dict[str, Any]]:
    """Model settings that make `models` play through `reader` (plus `own` settings for each)."""
    chosen = {"stream_reader": "litellm"} if reader == "litellm" else {}
    return {model: {**chosen, **own} for model in models}


ErrorSeen = tuple[str, str, bool]   # a ProviderError's kind, message and after_first_delta


async def outcome(models: list[str], reader: str, messages: list[dict[str, Any]] = MESSAGES, *, start: int = 0,
                  own: Mapping[str, Any] | None = None, **kw: Any) -> tuple[list[StreamItem], ErrorSeen | None]:
    """Everything a caller of `stream_model` sees with `reader`: the items, then the error if any."""
    items: list[StreamItem] = []
    try:
        async for item in stream_model(models, messages, conversation_id="conv", next_call_index=Counter(start),
                                       settings=reader_settings(reader, *models, **(own or {})), **kw):
            items.append(item)
    except ProviderError as exc:
        assert exc.model in models
        return items, (exc.kind, exc.message, exc.after_first_delta)
    return items, None


async def both(models: list[str], messages: list[dict[str, Any]] = MESSAGES, **kw: Any) -> tuple[Any, Any]:
    return await outcome(models, "direct", messages, **kw), await outcome(models, "litellm", messages, **kw)


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


@pytest.mark.parametrize("reader", READERS)
async def test_150_identical_deltas_pass(reader: str) -> None:
    model = register_script("s-same", Script(rounds=[Round(deltas=["same"] * 150)]))
    items, error = await outcome([model], reader)
    assert error is None
    assert items[:-1] == [ModelDelta("same")] * 150
    assert items[-1] == ModelFinished("stop", model)


async def test_litellm_repetition_guard_would_fire_without_the_lean_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shows the test above exercises the guard: at LiteLLM's default limit the same stream fails."""
    litellm = litellm_module()
    assert LEAN_SETTINGS["REPEATED_STREAMING_CHUNK_LIMIT"] == litellm.REPEATED_STREAMING_CHUNK_LIMIT
    monkeypatch.setattr(litellm, "REPEATED_STREAMING_CHUNK_LIMIT", 100)
    model = register_script("s-same-default", Script(rounds=[Round(deltas=["same"] * 150)]))
    _, error = await outcome([model], "litellm")
    assert error is not None
    assert error[2] is True
    assert "repeating the same chunk" in error[1]


@pytest.mark.parametrize("reader", READERS)
async def test_closing_early_stops_the_playback(reader: str) -> None:
    model = register_script("s-abort", Script(rounds=[Round(text="y" * 5000, chunk_chars=1)]))
    got = []
    playing = open_playbacks()
    async with aclosing(stream_model([model], MESSAGES, conversation_id="c", next_call_index=Counter(),
                                     settings=reader_settings(reader, model))) as gen:
        async for item in gen:
            got.append(item)
            if len(got) == 3:
                assert open_playbacks() == playing + 1
                break
    assert open_playbacks() == playing  # the prefix policy's abort really stops the generation
    assert got == [ModelDelta("y")] * 3


@pytest.mark.parametrize("reader", READERS)
async def test_timeout_before_first_delta_falls_back(reader: str) -> None:
    slow = register_script("s-slow", Script(rounds=[Round(deltas=["late"], delay_ms=5000)]))
    fast = register_script("s-fast", Script(rounds=[Round(text="x"), Round(text="in time")]))
    items, error = await outcome([slow, fast], reader, timeout_s=0.05)
    assert error is None
    assert isinstance(items[0], ModelFallback) and items[0].error == "timeout: no chunk within 0.05 s"
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


# -- the direct player and LiteLLM's custom provider, side by side --------------------------------


def test_scripted_models_are_played_directly_unless_their_settings_ask_for_litellm() -> None:
    def call(model: str, settings: dict[str, Any]) -> ModelCall:
        return ModelCall.resolve(model, MESSAGES, settings, conversation_id="c", call_index=0)

    assert plays_directly(call("scripted/demo", {}))
    assert plays_directly(call("scripted/demo", {"stream_reader": "fast", "temperature": 0.2}))
    assert not plays_directly(call("scripted/demo", {"stream_reader": "litellm"}))
    assert not plays_directly(call("openai/gpt-4o", {}))


@pytest.mark.parametrize("reader", READERS)
async def test_only_the_litellm_reader_calls_litellm(reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("LiteLLM was called")

    monkeypatch.setattr(litellm_module(), "acompletion", refuse)
    model = register_script("s-who", Script(rounds=[Round(text="hi")]))
    items, error = await outcome([model], reader)
    if reader == "direct":
        assert (items, error) == ([ModelDelta("hi"), ModelFinished("stop", model)], None)
    else:
        assert error is not None and "LiteLLM was called" in error[1]


chunking = st.one_of(
    st.builds(lambda deltas: {"deltas": deltas}, st.lists(st.text(max_size=6), min_size=1, max_size=12)),
    st.builds(lambda text, n: {"text": text, "chunk_chars": n}, st.text(max_size=40), st.integers(1, 7)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=chunking, finish=st.sampled_from(["stop", "length", "content_filter"]),
       error=st.none() | st.sampled_from(list(ErrorKind)),
       usage=st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)),
       include_usage=st.booleans(), question=st.text(max_size=30))
async def test_the_direct_player_streams_what_litellm_streams(
    content: dict[str, Any], finish: str, error: ErrorKind | None, usage: tuple[int, int] | None,
    include_usage: bool, question: str,
) -> None:
    given_usage = None if usage is None else RoundUsage(prompt_tokens=usage[0], completion_tokens=usage[1])
    model = register_script("s-same-as-litellm", Script(rounds=[
        Round(**content, finish_reason=finish, error=error, usage=given_usage)]))  # type: ignore[arg-type]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": question}]
    direct, lite = await both([model], messages, include_usage=include_usage)
    assert direct == lite
    items, seen = direct
    assert texts(items) == "".join(Round(**content).chunks)
    if error is not None:
        assert seen == (error.value, f"scripted {error.value}", bool(texts(items)))
    elif include_usage:
        assert isinstance(items[-1], ModelFinished) and items[-1].finish_reason == finish
        assert items[-1].usage is not None and (given_usage is None or items[-1].usage == Usage(*usage))  # type: ignore[misc]


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_errors_before_the_first_delta_are_the_same_provider_errors(kind: ErrorKind) -> None:
    model = register_script(f"s-err-{kind.value}", Script(rounds=[Round(error=kind)]))
    direct, lite = await both([model])
    assert direct == lite == ([], (kind.value, f"scripted {kind.value}", False))


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_errors_mid_stream_are_the_same_provider_errors(kind: ErrorKind) -> None:
    model = register_script(f"s-mid-{kind.value}", Script(rounds=[Round(deltas=["ab", "cd"], error=kind)]))
    direct, lite = await both([model])
    assert direct == lite == ([ModelDelta("ab"), ModelDelta("cd")], (kind.value, f"scripted {kind.value}", True))


async def test_a_length_finish_is_the_same_on_both_readers() -> None:
    model = register_script("s-length", Script(rounds=[Round(text="cut off in the midd", finish_reason="length")]))
    direct, lite = await both([model], include_usage=True)
    assert direct == lite
    assert direct[0][-1] == ModelFinished("length", model, Usage(1, 5))  # "hi": 1 token; 19 characters: 5


async def test_a_fallback_reads_the_same_on_both_readers() -> None:
    failing = register_script("s-fb-a", Script(rounds=[Round(error=ErrorKind.UNAVAILABLE)], loop=True))
    backup = register_script("s-fb-b", Script(rounds=[Round(text="zero"), Round(text="from backup")]))
    direct, lite = await both([failing, backup])
    assert direct == lite
    assert direct[0][0] == ModelFallback(failing, backup, "unavailable: scripted unavailable")
    assert texts(direct[0]) == "from backup"


async def test_unknown_and_used_up_scripts_fail_the_same_on_both_readers() -> None:
    once = register_script("s-once-both", Script(rounds=[Round(text="once")]))
    direct, lite = await both([once], start=1)
    assert direct == lite == ([], ("script_exhausted", "script_exhausted: script 's-once-both' has 1 round(s), "
                                   "no round for call 1", False))
    direct, lite = await both(["scripted/never-registered"])
    assert direct == lite == ([], ("not_found", "no script registered as 'never-registered' "
                                   "(model 'scripted/never-registered')", False))


async def test_a_continuation_request_plays_the_same_rest_on_both_readers() -> None:
    full = "<channel:thinking>A long thought, cut.</channel:thinking>"
    model = register_script("s-cont", Script(rounds=[Round(text=full)], loop=True, continues=True))
    asked = [{"role": "user", "content": "x"}, {"role": "assistant", "content": full[:20]},
             {"role": "user", "content": "[continue] go on"}]
    direct, lite = await both([model], asked, start=1)
    assert direct == lite
    assert texts(direct[0]) == full[20:]


@pytest.mark.parametrize("hang_after", [1, 2])
async def test_a_hang_after_the_first_delta_is_cut_by_the_idle_timeout_on_both_readers(hang_after: int) -> None:
    model = register_script(f"s-hang-{hang_after}", Script(rounds=[Round(deltas=["a", "b"], hang_after=hang_after)]))
    direct, lite = await both([model], idle_timeout_s=0.05)
    assert direct == lite
    assert direct == ([ModelDelta(t) for t in "ab"[:hang_after]],
                      ("timeout", "no chunk for 0.05 s in the middle of the response", True))


async def test_quiet_empty_chunks_add_up_to_an_idle_cut_on_both_readers() -> None:
    # 30 ms + 30 ms between "a" and "b" (the empty delta shows nothing): over a 50 ms idle timeout.
    model = register_script("s-quiet", Script(rounds=[Round(deltas=["a", "", "b"], delay_ms=30)]))
    direct, lite = await both([model], idle_timeout_s=0.05)
    assert direct == lite == ([ModelDelta("a")], ("timeout", "no chunk for 0.05 s in the middle of the response", True))


async def test_the_direct_player_cuts_only_on_the_scripts_own_clock() -> None:
    # Each gap (30 ms) is within the idle timeout (50 ms): never cut, however loaded the machine.
    model = register_script("s-steady", Script(rounds=[Round(deltas=["a", "b", "c"], delay_ms=30)]))
    items, error = await outcome([model], "direct", idle_timeout_s=0.05)
    assert (texts(items), error) == ("abc", None)


async def test_the_settings_timeout_wins_over_the_callers_on_both_readers() -> None:
    model = register_script("s-own-timeout", Script(rounds=[Round(deltas=["late"], delay_ms=300)]))
    direct, lite = await both([model], timeout_s=10, own={"timeout": 0.05})
    assert direct == lite == ([], ("timeout", "no chunk within 0.05 s", False))


async def test_a_key_variable_that_is_not_set_is_auth_on_both_readers() -> None:
    model = register_script("s-keyed", Script(rounds=[Round(text="never")]))
    direct, lite = await both([model], own={"api_key_env": "REACTGATE_TEST_UNSET_KEY_VARIABLE"})
    assert direct == lite
    assert direct[1] is not None and direct[1][0] == "auth" and "REACTGATE_TEST_UNSET_KEY_VARIABLE" in direct[1][1]


# -- native rounds (docs/design.md#native), side by side ----------------------------------------------
#
# What LiteLLM's custom-provider path cannot carry (actors/llm/scripted.py): a call's end — an
# OpenAI-shaped chunk has no field for it, so a reader ends a call at the next call or the finish.
# The generated messages put reasoning first, then content, then calls, as models write them: a
# call's end is then always followed by the next call or the finish, where a reader can place it.

reasoning_part = st.builds(lambda text, signature: {"reasoning": text, **({"signature": signature} if signature else {})},
                           st.text(max_size=12), st.none() | st.text(min_size=1, max_size=6))
redacted_part = st.builds(lambda data: {"redacted": data}, st.text(min_size=1, max_size=8))
call_part = st.builds(
    lambda name, arguments: {"call": {"name": name, "arguments": arguments}},
    st.sampled_from(["demo_weather", "demo_clock", "invented-one"]),
    st.dictionaries(st.text(max_size=4), st.integers() | st.text(max_size=4), max_size=2) | st.text(max_size=10),
)
native_message = st.builds(lambda thoughts, text, calls: [*thoughts, *text, *calls],
                           st.lists(reasoning_part | redacted_part, max_size=3),
                           st.lists(st.builds(lambda t: {"text": t}, st.text(max_size=20)), max_size=1),
                           st.lists(call_part, max_size=3)).filter(bool)
native_round = st.builds(
    lambda parts, n, length, error: {"native": parts, "chunk_chars": n, **({"finish_reason": "length"} if length else {}),
                                     **({"error": error} if error else {})},
    native_message, st.integers(1, 7), st.booleans(), st.none() | st.sampled_from([k.value for k in ErrorKind]),
)


def shown(round_: Round) -> list[ModelOutput]:
    """The deltas a caller sees of a round: its stream without the empty chunks that only pace it."""
    return [d for d in round_.stream if not isinstance(d, ModelDelta) or d.text]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=native_round, include_usage=st.booleans())
async def test_the_direct_player_yields_a_native_rounds_stream_then_its_finish(
        data: dict[str, Any], include_usage: bool) -> None:
    model = register_script("s-native-direct", parse_script({"rounds": [data]}))
    round_ = Round.model_validate(data)
    items, seen = await outcome([model], "direct", include_usage=include_usage)
    if round_.error is not None:
        assert items == shown(round_)
        assert seen == (round_.error.value, f"scripted {round_.error.value}", bool(items))
        return
    assert seen is None and items[:-1] == shown(round_)
    finished = items[-1]
    assert isinstance(finished, ModelFinished) and finished.finish_reason == round_.finish_reason
    assert (finished.usage is not None) is include_usage
    assert all(any(isinstance(d, ToolCallEnd) and d.index == s.index for d in items)
               for s in items if isinstance(s, ToolCallStart))   # every started call ended before the finish


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=native_round, include_usage=st.booleans(), question=st.text(max_size=30))
async def test_the_direct_player_streams_what_litellm_streams_for_native_rounds(
        data: dict[str, Any], include_usage: bool, question: str) -> None:
    model = register_script("s-native-same-as-litellm", parse_script({"rounds": [data]}))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": question}]
    (direct, direct_error), (lite, lite_error) = await both([model], messages, include_usage=include_usage)
    # LiteLLM's wrapper has no field for a call's end: its reader ends the calls at the finish.
    assert ends_at_the_finish(direct) == ends_at_the_finish(lite) and direct_error == lite_error


async def test_a_native_round_failing_mid_call_is_an_error_after_the_first_delta_with_the_call_open() -> None:
    model = register_script("s-native-cut", parse_script({"rounds": [
        {"native": [{"call": {"name": "demo_weather", "arguments": {"city": "Paris"}}, "split": [4]}],
         "error": "server_error"}]}))
    items, seen = await outcome([model], "direct")
    assert items == [ToolCallStart(0, "call_0", "demo_weather"), ToolCallArgs(0, '{"ci'),
                     ToolCallArgs(0, 'ty": "Paris"}')]   # no ToolCallEnd: the provider failed inside the call
    assert seen == ("server_error", "scripted server_error", True)


async def test_a_reasoning_only_start_counts_as_the_first_delta_for_the_idle_timeout() -> None:
    model = register_script("s-native-quiet", parse_script({"rounds": [
        {"native": [{"reasoning": "hm", "signature": "s"}, {"text": "late"}], "chunk_chars": 2, "hang_after": 2}]}))
    items, seen = await outcome([model], "direct", idle_timeout_s=0.05)
    assert items == [*shown(Round.model_validate({"native": [{"reasoning": "hm", "signature": "s"}]}))]
    assert isinstance(items[-1], ReasoningSignature)
    assert seen == ("timeout", "no chunk for 0.05 s in the middle of the response", True)


async def test_a_by_message_script_plays_each_conversation_its_sub_script_on_both_readers() -> None:
    model = register_script("s-by", parse_script({
        "by_message": {"weather": {"rounds": [{"native": [{"text": "Rain."}]}]}},
        "default": {"rounds": [{"text": "Hello."}]}}))
    for first, expected in (("Weather in Paris?", "Rain."), ("hi", "Hello.")):
        direct, lite = await both([model], [{"role": "user", "content": first}])
        assert direct == lite
        assert texts(direct[0]) == expected


async def test_a_native_continuation_of_a_prefill_plays_the_same_rest_on_both_readers() -> None:
    model = register_script("s-native-cont", parse_script({"continues": True, "loop": True, "rounds": [
        {"native": [{"reasoning": "Sure."}, {"text": "It rains in Paris, 12 °C."}], "chunk_chars": 5}]}))
    asked = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "It rains in"}]
    direct, lite = await both([model], asked, start=1)
    assert direct == lite
    assert texts(direct[0]) == " Paris, 12 °C."
