"""The scripted model (docs/design.md#scripted-model): the script format, its playback, and the LiteLLM custom provider playing it.

Provider tests go through `litellm.acompletion(stream=True)` — the real LiteLLM streaming path.
`stream_model`'s direct player, and its equivalence with the provider, are tested in test_llm_stream.py.
"""

from __future__ import annotations

import json
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
        ({}, "needs `deltas`, `text` or `error`"),
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
    got: list[str] = []
    with pytest.raises(RoundFailed) as err:
        async for text in scripts.play(Round(deltas=["a", "", "b"], error=ErrorKind.RATE_LIMIT), read_timeout_s=None):
            got.append(text)
    assert got == ["a", "", "b"]  # empty deltas too: skipping them is the reader's business
    assert (err.value.kind, err.value.message) == ("rate_limit", "scripted rate_limit")


async def test_a_hang_before_the_first_delta_is_not_cut_by_the_idle_timeout() -> None:
    import asyncio

    playing = open_playbacks()
    texts = scripts.play(Round(deltas=["", "b"], hang_after=1), read_timeout_s=None, idle_timeout_s=0.01)
    assert await anext(texts) == ""
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


def test_ensure_registered_is_idempotent(litellm: Any) -> None:
    from actors.llm.scripted import ensure_registered

    first = ensure_registered()
    assert ensure_registered() is first
    assert [e["provider"] for e in litellm.custom_provider_map].count("scripted") == 1
    assert litellm._custom_providers.count("scripted") == 1
