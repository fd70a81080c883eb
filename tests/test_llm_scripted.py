"""The scripted model (docs/design.md#scripted-model): the script format, its playback, and the LiteLLM custom provider playing it.

Provider tests go through `litellm.acompletion(stream=True)` — the real LiteLLM streaming path.
`stream_model`'s direct player, and its equivalence with the provider, are tested in test_llm_stream.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from actors.llm import scripts
from actors.llm.errors import SCRIPT_EXHAUSTED, ErrorKind, error_kind
from actors.llm.scripts import (
    CALL_INDEX_HEADER,
    CONVERSATION_HEADER,
    DEFAULT_CHUNK_CHARS,
    Round,
    RoundFailed,
    Script,
    ScriptError,
    get_script,
    load_script,
    open_playbacks,
    parse_script,
    register_script,
    round_to_play,
)
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

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def litellm() -> Any:
    from actors.llm.lite import litellm_module
    from actors.llm.scripted import ensure_registered

    ensure_registered()   # what LiteLLM's reader does before it plays a scripted model
    return litellm_module()


def headers(call_index: int, conversation: str = "conv-1") -> dict[str, str]:
    return {CONVERSATION_HEADER: conversation, CALL_INDEX_HEADER: str(call_index)}


async def play(
    litellm: Any, model: str, call_index: int | None, conversation: str = "conv-1", **kwargs: Any
) -> tuple[list[str], str | None]:
    """(deltas, finish_reason) of one streamed call through LiteLLM; no call index header if None."""
    sent = headers(call_index, conversation) if call_index is not None else {CONVERSATION_HEADER: conversation}
    stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, extra_headers=sent, **kwargs)
    texts: list[str] = []
    finish: str | None = None
    try:
        async for chunk in stream:
            choice = chunk.choices[0]
            if choice.delta.content:
                texts.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish = choice.finish_reason
    finally:
        await stream.aclose()
    return texts, finish


# -- the script format -------------------------------------------------------------------------


FULL = '<channel:thinking>A.</channel:thinking><channel:action>```json\n{"action": "complete", "final_answer": "It is \\"wet\\" today."}\n```</channel:action>'


def ask_to_continue(so_far: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "x"}, {"role": "assistant", "content": so_far},
            {"role": "user", "content": "[continue] go on"}]


def test_a_script_that_continues_answers_a_continuation_with_the_rest_of_the_cut_round() -> None:
    script = Script(rounds=[Round(text="<channel:thinking>tool</channel:thinking>"), Round(text=FULL)], loop=True,
                    continues=True)
    assert "".join(script.answer(2, ask_to_continue(FULL[:50])).chunks) == FULL[50:]    # the same text: its suffix
    rebuilt = '<channel:thinking>A.</channel:thinking><channel:action>{"action": "complete", "final_answer": "It is \\"w'
    assert "".join(script.answer(2, ask_to_continue(rebuilt)).chunks) == 'et\\" today."}</channel:action>'
    other = '<channel:action>{"action": "complete", "final_answer": "Something else'
    assert script.answer(2, ask_to_continue(other)) == script.rounds[0]                     # nothing continues it
    assert script.answer(3, [{"role": "user", "content": "hi"}]) == script.rounds[1]        # a new request: by index


def test_a_script_that_does_not_continue_plays_its_round_when_asked_to_continue() -> None:
    script = Script(rounds=[Round(text=FULL), Round(text="<channel:thinking>again</channel:thinking>")])
    assert script.answer(1, ask_to_continue(FULL[:50])) == script.rounds[1]


def test_text_is_cut_into_chunk_chars_pieces_default_four() -> None:
    assert DEFAULT_CHUNK_CHARS == 4
    assert Round(text="abcdefghij").chunks == ("abcd", "efgh", "ij")
    assert Round(text="abcdefghij", chunk_chars=3).chunks == ("abc", "def", "ghi", "j")
    assert Round(text="é°€😀x", chunk_chars=2).chunks == ("é°", "€😀", "x")  # code points, not bytes


def test_deltas_are_kept_as_given() -> None:
    assert Round(deltas=["<chan", "", "nel:thinking>"]).chunks == ("<chan", "", "nel:thinking>")


def test_round_defaults() -> None:
    r = Round(text="x")
    assert (r.finish_reason, r.delay_ms, r.error) == ("stop", 0, None)
    assert Script(rounds=[r]).loop is False


@pytest.mark.parametrize(
    ("round_", "needle"),
    [
        ({"deltas": ["a"], "text": "a"}, "either `deltas` or `text`"),
        ({}, "needs `deltas`, `text`, `native` or `error`"),
        ({"deltas": ["a"], "chunk_chars": 2}, "`chunk_chars` applies only to `text`"),
        ({"text": "a", "chunk_chars": 0}, "rounds.0.chunk_chars"),
        ({"text": "a", "delay_ms": -1}, "rounds.0.delay_ms"),
        ({"error": "teapot"}, "rounds.0.error"),
        ({"text": "a", "finish_reason": "done"}, "rounds.0.finish_reason"),
        ({"text": "a", "colour": "red"}, "rounds.0.colour"),
        ({"text": "a", "hang_after": -1}, "rounds.0.hang_after"),
        ({"text": "a", "hang_after": 0, "error": "timeout"}, "one of `hang_after`, `error`"),
    ],
)
def test_invalid_round_is_rejected_naming_the_field(round_: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScriptError) as err:
        parse_script({"rounds": [round_]}, source="s.json")
    assert "s.json: " in str(err.value)
    assert needle in str(err.value)


def test_script_needs_a_round() -> None:
    with pytest.raises(ScriptError, match="rounds"):
        parse_script({"rounds": []})


def test_load_script_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(ScriptError, match=r"broken\.json: not valid JSON"):
        load_script(bad)
    bad.write_text(json.dumps({"rounds": [{"text": "a"}], "lop": True}))
    with pytest.raises(ScriptError, match=r"broken\.json: lop: Extra inputs are not permitted"):
        load_script(bad)


def test_exhausted_script_raises_script_exhausted() -> None:
    script = Script(rounds=[Round(text="a"), Round(text="b")])
    assert script.round_for(1).text == "b"
    with pytest.raises(LookupError, match=SCRIPT_EXHAUSTED):
        script.round_for(2)


def test_loop_restarts_at_round_zero() -> None:
    script = Script(rounds=[Round(text="a"), Round(text="b")], loop=True)
    assert [script.round_for(i).text for i in range(5)] == ["a", "b", "a", "b", "a"]


def test_builtin_demo_script_resolves_without_registration() -> None:
    demo = get_script("demo")
    assert demo.loop is True
    assert all(r.chunk_chars == 4 and r.delay_ms > 0 for r in demo.rounds)


def test_demo_script_speaks_the_decision_protocol() -> None:
    """Round A calls demo.weather for Paris; round B completes — parsed by the project's own parser."""
    from protocol.actions import CallTool, Finish
    from protocol.channels import ActionClosed, BlockText, Channel, ChannelParser, ChannelViolation

    actions = []
    for round_ in get_script("demo").rounds:
        parser = ChannelParser()
        events = [e for chunk in round_.chunks for e in parser.feed(chunk)] + parser.finish()
        assert not [e for e in events if isinstance(e, ChannelViolation)]
        assert isinstance(events[1], BlockText) and events[1].channel is Channel.THINKING, "thinking comes first"
        [closed] = [e for e in events if isinstance(e, ActionClosed)]
        assert closed.violations == ()
        actions.append(closed.action)
    assert actions[0] == CallTool(tool_id="demo.weather", params={"city": "Paris"})
    assert isinstance(actions[1], Finish) and actions[1].type == "complete"
    assert actions[1].final_answer.startswith("It is raining in Paris, 12 °C.")
    assert actions[1].final_answer.count(".") >= 2  # a couple of sentences, so streaming is visible


# -- native rounds (docs/design.md#native) -------------------------------------------------------

WEATHER = {"native": [{"reasoning": "Rain?", "signature": "sig-1"}, {"redacted": "opaque"},
                      {"text": "Let me check."},
                      {"call": {"name": "demo_weather", "arguments": {"city": "Paris"}, "id": "call_1"}, "split": [5, 12]}],
           "chunk_chars": 4, "delay_ms": 20}


def test_a_native_round_streams_its_parts_as_typed_deltas_each_call_ended_before_the_finish() -> None:
    r = parse_script({"rounds": [WEATHER]}).rounds[0]
    assert r.stream == (
        ReasoningDelta("Rain"), ReasoningDelta("?"), ReasoningSignature("sig-1"), RedactedReasoning("opaque"),
        ModelDelta("Let "), ModelDelta("me c"), ModelDelta("heck"), ModelDelta("."),
        ToolCallStart(0, "call_1", "demo_weather"),
        ToolCallArgs(0, '{"cit'), ToolCallArgs(0, 'y": "Pa'), ToolCallArgs(0, 'ris"}'), ToolCallEnd(0),
    )
    assert (r.finish_reason, r.chunks) == ("tool_calls", ("Let ", "me c", "heck", "."))


def test_call_arguments_are_serialized_or_sent_raw_and_cut_into_chunk_chars_pieces_without_split() -> None:
    r = Round.model_validate({"native": [{"call": {"name": "a", "arguments": {"q": "é"}}},
                                         {"call": {"name": "b", "arguments": '{"not json'}}], "chunk_chars": 5})
    assert r.stream == (ToolCallStart(0, "call_0", "a"), ToolCallArgs(0, '{"q":'), ToolCallArgs(0, ' "é"}'),
                        ToolCallEnd(0), ToolCallStart(1, "call_1", "b"), ToolCallArgs(1, '{"not'),
                        ToolCallArgs(1, " json"), ToolCallEnd(1))


@pytest.mark.parametrize(("parts", "finish"), [
    ([{"text": "It rains."}], "stop"),
    ([{"reasoning": "hm"}, {"call": {"name": "a"}}], "tool_calls"),
])
def test_a_native_round_finishes_with_tool_calls_when_its_message_calls_else_with_stop(
        parts: list[dict[str, Any]], finish: str) -> None:
    assert Round.model_validate({"native": parts}).finish_reason == finish
    assert Round.model_validate({"native": parts, "finish_reason": "length"}).finish_reason == "length"


def test_a_native_round_that_fails_leaves_its_last_call_open() -> None:
    r = Round.model_validate({"native": [{"call": {"name": "a"}}, {"call": {"name": "b", "arguments": "{"}}],
                              "error": "server_error"})
    assert r.stream == (ToolCallStart(0, "call_0", "a"), ToolCallArgs(0, "{}"), ToolCallEnd(0),
                        ToolCallStart(1, "call_1", "b"), ToolCallArgs(1, "{"))   # cut mid-call


async def test_hang_after_counts_a_native_rounds_deltas() -> None:
    import asyncio

    r = Round.model_validate({"native": [{"call": {"name": "a", "arguments": "{}"}, "split": [1]}], "hang_after": 2})
    got: list[ModelOutput] = []

    async def read() -> None:
        async for delta in scripts.play(r, read_timeout_s=None):
            got.append(delta)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(read(), 0.2)
    assert got == [ToolCallStart(0, "call_0", "a"), ToolCallArgs(0, "{")]   # silent in the middle of the arguments


@pytest.mark.parametrize(
    ("round_", "needle"),
    [
        ({"native": []}, "rounds.0.native: "),
        ({"native": [{"thought": "x"}]}, "rounds.0.native.0: a native part has one of the keys"),
        ({"native": [{"call": {"arguments": {}}}]}, "rounds.0.native.0.call.call.name: Field required"),
        ({"native": [{"call": {"name": "a", "arguments": "abc"}, "split": [3]}]}, "rounds.0.native.0.call: "),
        ({"native": [{"call": {"name": "a", "arguments": "abcd"}, "split": [2, 1]}]}, "`split` points must increase"),
        ({"native": [{"text": "a", "colour": "red"}]}, "rounds.0.native.0.text.colour"),
        ({"native": [{"reasoning": "a", "signature": ""}]}, "rounds.0.native.0.reasoning.signature"),
        ({"native": [{"text": "a"}], "text": "a"}, "either `text` or `native`"),
        ({"native": [{"text": "a"}], "finish_reason": "tool_calls"}, "`tool_calls` needs a native round"),
        ({"text": "a", "finish_reason": "tool_calls"}, "`tool_calls` needs a native round"),
        ({"native": [{"text": "a"}], "finish_reason": "content_filter"}, "finishes with `stop`, `length` or"),
        ({"native": [{"call": {"name": "a", "id": "call_1"}}, {"call": {"name": "b"}}]}, "call ids must differ"),
    ],
)
def test_invalid_native_round_is_rejected_naming_the_field(round_: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScriptError) as err:
        parse_script({"rounds": [round_]}, source="s.json")
    assert needle in str(err.value)


def ask_to_go_on(so_far: Any, *, prefill: bool) -> list[dict[str, Any]]:
    asked: list[dict[str, Any]] = [{"role": "user", "content": "x"}, {"role": "assistant", "content": so_far}]
    return asked if prefill else [*asked, {"role": "user", "content": "[continue] go on"}]


@pytest.mark.parametrize("prefill", [True, False])
def test_a_native_round_is_continued_from_where_its_answer_stopped(prefill: bool) -> None:
    answer = Round.model_validate({"native": [{"reasoning": "ok"}, {"text": "It rains in Paris. Take care."}],
                                   "chunk_chars": 3, "delay_ms": 5, "finish_reason": "length"})
    script = Script(rounds=[Round(native=[{"call": {"name": "a"}}]), answer], loop=True, continues=True)
    so_far = "It rains in" if prefill else "It rains in "   # a prefill leaves its trailing whitespace off
    rest = script.answer(2, ask_to_go_on(so_far, prefill=prefill))
    assert rest.stream == (ModelDelta(" Pa") if prefill else ModelDelta("Par"), *rest.stream[1:])
    assert "".join(rest.chunks) == "It rains in Paris. Take care."[len(so_far):]
    assert (rest.chunk_chars, rest.delay_ms, rest.finish_reason) == (3, 5, "length")


def test_a_native_continuation_reads_anthropic_blocks_and_goes_on_after_the_last_call() -> None:
    said = Round.model_validate({"native": [{"call": {"name": "a"}}, {"text": "Done: 42."}]})
    script = Script(rounds=[said], loop=True, continues=True)
    rest = script.answer(1, ask_to_go_on([{"type": "text", "text": "Done:"}], prefill=True))
    assert rest.chunks == (" 42.",) and rest.finish_reason == "stop"   # the calls came before the cut
    assert script.answer(1, ask_to_go_on("Something else", prefill=True)) == said   # nothing continues it: by index


def test_a_script_that_does_not_continue_plays_its_round_when_sent_a_prefill() -> None:
    script = Script(rounds=[Round(native=[{"text": "It rains."}]), Round(text="again")])
    assert script.answer(1, ask_to_go_on("It", prefill=True)) == script.rounds[1]


def test_builtin_demo_native_script_is_the_demo_in_native_calls() -> None:
    """The same call (demo_weather for Paris, arguments in fragments, after a preamble) and the same
    answer as the channel demo — read by the project's own native decoder."""
    from protocol.actions import CallTool, Finish
    from protocol.channels import ActionClosed, BlockText, Channel
    from protocol.native import NativeDecoder

    demo, native = get_script("demo"), get_script("demo_native")
    assert (native.loop, native.continues) == (demo.loop, demo.continues)
    actions, thinking = [], []
    for round_ in native.rounds:
        decoder = NativeDecoder({"demo_weather": "demo.weather"}, hold_chars=120)
        events = [e for d in round_.stream for e in decoder.feed(d)] + decoder.finish()
        thinking += [e.text for e in events if isinstance(e, BlockText) and e.channel is Channel.THINKING]
        actions += [e.action for e in events if isinstance(e, ActionClosed)]
    call, answer = actions
    assert call == CallTool(tool_id="demo.weather", params={"city": "Paris"})
    assert sum(type(d) is ToolCallArgs for d in native.rounds[0].stream) > 1   # arguments in fragments
    assert thinking == ["Let me check the weather in Paris."]                   # the preamble
    assert isinstance(answer, Finish) and answer.type == "complete"
    channel_answer = json.loads(demo.rounds[1].text.split("```json\n")[1].split("\n```")[0])["final_answer"]  # type: ignore[union-attr]
    assert answer.final_answer == channel_answer


# -- by_message: one script, a behaviour per conversation ------------------------------------------

BY_MESSAGE = {"by_message": {"weather": {"rounds": [{"text": "W"}]}, "budget": {"rounds": [{"text": "B"}]},
                             "weather budget": {"rounds": [{"text": "never: an earlier key matches first"}]}},
              "default": {"rounds": [{"text": "D"}], "loop": True}}


@pytest.mark.parametrize(("first", "played"), [
    ("What is the Weather in Paris?", "W"),
    ("my budget please", "B"),
    ("weather budget", "W"),          # the first key that matches wins
    ("hello", "D"),
])
def test_by_message_picks_the_sub_script_by_the_first_user_message(first: str, played: str) -> None:
    script = parse_script(BY_MESSAGE)
    later = [{"role": "system", "content": "s"}, {"role": "user", "content": first},
             {"role": "assistant", "content": "…"}, {"role": "user", "content": "budget"}]
    assert script.answer(0, later).text == played


def test_by_message_reads_anthropic_content_blocks() -> None:
    script = parse_script(BY_MESSAGE)
    assert script.answer(0, [{"role": "user", "content": [{"type": "text", "text": "a budget"}]}]).text == "B"


def test_by_message_without_a_match_or_default_is_a_bad_request() -> None:
    register_script("t-by", parse_script({"by_message": {"weather": {"rounds": [{"text": "W"}]}}}))
    assert round_to_play("t-by", 0, [{"role": "user", "content": "weather?"}]).text == "W"
    with pytest.raises(RoundFailed) as err:
        round_to_play("t-by", 0, [{"role": "user", "content": "hello"}])
    assert err.value.kind == "bad_request" and "no sub-script" in err.value.message


@pytest.mark.parametrize(("script", "needle"), [
    ({"by_message": {"w": {"rounds": [{"text": "x"}]}}, "rounds": [{"text": "x"}]}, "no `rounds`, `loop` or"),
    ({"by_message": {"w": {"rounds": [{"text": "x"}]}}, "loop": True}, "no `rounds`, `loop` or"),
    ({"by_message": {"w": {"by_message": {"v": {"rounds": [{"text": "x"}]}}}}}, "no sub-scripts of its own"),
    ({"by_message": {}}, "by_message: "),
    ({"by_message": {"w": {"rounds": [{"txt": "x"}]}}}, "by_message.w.rounds.0.txt"),
    ({"rounds": [{"text": "x"}], "default": {"rounds": [{"text": "x"}]}}, "`default` applies only to `by_message`"),
    ({"loop": True}, "needs `rounds` or `by_message`"),
])
def test_invalid_by_message_script_is_rejected_naming_the_field(script: dict[str, Any], needle: str) -> None:
    with pytest.raises(ScriptError, match=re.escape(needle)):
        parse_script(script)


# -- playback, shared by both in-process players ------------------------------------------------


def test_a_round_to_play_fails_as_a_provider_would() -> None:
    register_script("t-once", Script(rounds=[Round(text="a")]))
    assert round_to_play("t-once", 0, MESSAGES).text == "a"
    with pytest.raises(RoundFailed) as err:
        round_to_play("t-once", 1, MESSAGES)
    assert (err.value.error, err.value.kind) == (ErrorKind.BAD_REQUEST, SCRIPT_EXHAUSTED)
    with pytest.raises(RoundFailed) as err:
        round_to_play("t-nobody", 0, MESSAGES)
    assert (err.value.error, err.value.kind) == (ErrorKind.NOT_FOUND, "not_found")


async def test_play_streams_the_chunks_then_the_error() -> None:
    got: list[ModelOutput] = []
    with pytest.raises(RoundFailed) as err:
        async for delta in scripts.play(Round(deltas=["a", "", "b"], error=ErrorKind.RATE_LIMIT), read_timeout_s=None):
            got.append(delta)
    assert got == [ModelDelta("a"), ModelDelta(""), ModelDelta("b")]  # empty deltas too: skipping them is the reader's business
    assert (err.value.kind, err.value.message) == ("rate_limit", "scripted rate_limit")


async def test_a_hang_before_the_first_delta_is_not_cut_by_the_idle_timeout() -> None:
    import asyncio

    playing = open_playbacks()
    texts = scripts.play(Round(deltas=["", "b"], hang_after=1), read_timeout_s=None, idle_timeout_s=0.01)
    assert await anext(texts) == ModelDelta("")
    waiting = asyncio.ensure_future(anext(texts))
    done, _ = await asyncio.wait([waiting], timeout=0.2)
    assert not done  # nothing shown yet: only the read timeout, a cancel or the process's end stop it
    waiting.cancel()  # a cancel ends it, and the playback with it
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert open_playbacks() == playing


# -- the provider, through LiteLLM -------------------------------------------------------------


async def test_provider_streams_text_in_chunk_chars_pieces(litellm: Any) -> None:
    model = register_script("t-text", Script(rounds=[Round(text="Hello, world!", chunk_chars=5)]))
    assert await play(litellm, model, 0) == (["Hello", ", wor", "ld!"], "stop")


async def test_provider_streams_deltas_as_given(litellm: Any) -> None:
    deltas = ["<channel:thinking>", "Look", "ing°", "</channel:thinking>"]
    model = register_script("t-deltas", Script(rounds=[Round(deltas=deltas, finish_reason="length")]))
    assert await play(litellm, model, 0) == (deltas, "length")


async def test_call_index_selects_the_round_and_the_provider_keeps_no_counter(litellm: Any) -> None:
    model = register_script("t-index", Script(rounds=[Round(text="zero"), Round(text="one"), Round(text="two")]))
    # Any order, repeated: the round is a function of the index the caller sends, nothing else.
    assert [(await play(litellm, model, i))[0] for i in (2, 0, 2, 1)] == [["two"], ["zero"], ["two"], ["one"]]


async def test_without_call_index_a_per_conversation_counter_is_the_fallback(litellm: Any) -> None:
    model = register_script("t-nohdr", Script(rounds=[Round(text="zero"), Round(text="one")], loop=True))
    got = [(await play(litellm, model, None, conversation=c))[0] for c in ("nohdr-a", "nohdr-a", "nohdr-b", "nohdr-a")]
    assert got == [["zero"], ["one"], ["zero"], ["zero"]]  # each conversation plays its own copy


async def test_delay_ms_sleeps_before_each_delta(litellm: Any) -> None:
    model = register_script("t-delay", Script(rounds=[Round(deltas=["a", "b", "c"], delay_ms=40)]))
    stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, extra_headers=headers(0))
    start = time.monotonic()
    arrivals = []
    async for chunk in stream:
        if chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - start)
    await stream.aclose()
    gaps = [b - a for a, b in zip([0.0, *arrivals], arrivals, strict=False)]
    assert len(gaps) == 3
    assert all(g >= 0.039 for g in gaps), gaps


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_error_round_raises_before_any_chunk(litellm: Any, kind: ErrorKind) -> None:
    model = register_script(f"t-err-{kind.value}", Script(rounds=[Round(error=kind)]))
    stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, extra_headers=headers(0))
    received = []
    with pytest.raises(Exception) as err:
        async for chunk in stream:
            received.append(chunk)
    assert received == []
    assert error_kind(err.value) == kind.value


async def test_error_after_content_streams_the_content_first(litellm: Any) -> None:
    model = register_script("t-mid", Script(rounds=[Round(deltas=["ab", "cd"], error=ErrorKind.SERVER_ERROR)]))
    stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, extra_headers=headers(0))
    received: list[str] = []
    with pytest.raises(Exception) as err:
        async for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "abcd"
    assert error_kind(err.value) == "server_error"


async def test_exhausted_script_is_a_script_exhausted_provider_error(litellm: Any) -> None:
    model = register_script("t-exh", Script(rounds=[Round(text="only")]))
    assert (await play(litellm, model, 0))[0] == ["only"]
    with pytest.raises(Exception) as err:
        await play(litellm, model, 1)
    assert error_kind(err.value) == SCRIPT_EXHAUSTED


async def test_loop_script_plays_round_zero_after_the_last(litellm: Any) -> None:
    model = register_script("t-loop", Script(rounds=[Round(text="a"), Round(text="b")], loop=True))
    assert [(await play(litellm, model, i))[0] for i in range(4)] == [["a"], ["b"], ["a"], ["b"]]


async def test_unknown_script_is_a_not_found_provider_error(litellm: Any) -> None:
    with pytest.raises(Exception) as err:
        await play(litellm, "scripted/never-registered", 0)
    assert error_kind(err.value) == "not_found"


async def test_closing_the_stream_early_closes_the_provider_generator(litellm: Any) -> None:
    model = register_script("t-close", Script(rounds=[Round(text="x" * 4000, chunk_chars=1)]))
    playing = open_playbacks()
    stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, extra_headers=headers(0))
    got = 0
    async for chunk in stream:
        got += bool(chunk.choices[0].delta.content)
        if got == 3:
            break
    assert open_playbacks() == playing + 1  # suspended mid-round
    await stream.aclose()
    assert open_playbacks() == playing  # its generator ran its `finally`: generation stopped


async def test_read_timeout_shorter_than_the_delay_is_a_timeout(litellm: Any) -> None:
    model = register_script("t-slow", Script(rounds=[Round(deltas=["late"], delay_ms=2000)]))
    start = time.monotonic()
    with pytest.raises(Exception) as err:
        await play(litellm, model, 0, timeout=0.05)
    assert error_kind(err.value) == "timeout"
    assert time.monotonic() - start < 1.5


async def test_non_streaming_completion_joins_the_round(litellm: Any) -> None:
    model = register_script("t-nostream", Script(rounds=[Round(text="Hello there", finish_reason="length")]))
    response = await litellm.acompletion(model=model, messages=MESSAGES, extra_headers=headers(0))
    assert response.choices[0].message.content == "Hello there"
    assert response.choices[0].finish_reason == "length"


async def test_provider_streams_a_native_round_in_litellms_own_shapes(litellm: Any) -> None:
    model = register_script("t-native", parse_script({"rounds": [WEATHER]}))
    stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, extra_headers=headers(0))
    seen: list[tuple[str, Any]] = []
    finish = None
    async for chunk in stream:
        choice = chunk.choices[0]
        delta = choice.delta
        if delta.content:
            seen.append(("content", delta.content))
        if getattr(delta, "reasoning_content", None):
            seen.append(("reasoning", delta.reasoning_content))
        for block in getattr(delta, "thinking_blocks", None) or ():
            seen.append(("block", {k: v for k, v in block.items() if k != "index"}))
        for call in delta.tool_calls or ():
            seen.append(("call", (call.index, call.id, call.function.name, call.function.arguments)))
        finish = choice.finish_reason or finish
    assert seen == [
        ("reasoning", "Rain"), ("reasoning", "?"),
        ("block", {"type": "thinking", "thinking": "", "signature": "sig-1"}),   # as LiteLLM's Anthropic provider
        ("block", {"type": "redacted_thinking", "data": "opaque"}),
        ("content", "Let "), ("content", "me c"), ("content", "heck"), ("content", "."),
        ("call", (0, "call_1", "demo_weather", "")),                              # id and name first
        ("call", (0, None, None, '{"cit')), ("call", (0, None, None, 'y": "Pa')), ("call", (0, None, None, 'ris"}')),
    ]
    assert finish == "tool_calls"


async def test_non_streaming_completion_carries_a_native_rounds_calls(litellm: Any) -> None:
    model = register_script("t-native-whole", parse_script({"rounds": [WEATHER]}))
    message = (await litellm.acompletion(model=model, messages=MESSAGES, extra_headers=headers(0))).choices[0].message
    assert (message.content, message.reasoning_content) == ("Let me check.", "Rain?")
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("call_1", "demo_weather", {"city": "Paris"})]


def test_ensure_registered_is_idempotent(litellm: Any) -> None:
    from actors.llm.scripted import ensure_registered

    first = ensure_registered()
    assert ensure_registered() is first
    assert [e["provider"] for e in litellm.custom_provider_map].count("scripted") == 1
    assert litellm._custom_providers.count("scripted") == 1
