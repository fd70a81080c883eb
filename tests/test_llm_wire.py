"""The fast path's sans-I/O decoders (actors/llm/sse.py, openai_wire.py, anthropic_wire.py): bytes in,
model deltas out, the same however the network cuts the bytes (docs/design.md#model-settings) — text,
and the whole family of a native function-calling message (docs/design.md#native).

Every stream here is fed whole, then cut at arbitrary points (hypothesis), byte by byte, and with
the line ends of every SSE flavour; the deltas and the decoder's final state (end, finish reason,
usage, event count, failure) must not depend on where the cuts fall.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.llm.anthropic_wire import AnthropicMessagesDecoder
from actors.llm.errors import Fault, Usage
from actors.llm.fast import Decoder
from actors.llm.openai_wire import OpenAIChatDecoder
from actors.llm.sse import MAX_EVENT_BYTES, OVERSIZED, SSEFrames, fields
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    merged,
)
from tests.fixtures import native_sse as native
from tests.fixtures.anthropic_sse import event, transcript_events
from tests.fixtures.native_sse import ANTHROPIC_STOP, Call, NativeMessage, expected
from tests.native_strategies import messages

LINE_ENDS = ("\n", "\r\n", "\r")


def with_line_ends(data: bytes, end: str) -> bytes:
    """`data` with its line ends spelled `end`. With bare CRs, followed by the start of a keep-alive:
    a final CR is held until the next byte shows it is not the first half of a CRLF
    (test_a_final_bare_cr_waits_for_the_next_byte)."""
    return data.replace(b"\n", end.encode()) + (b":" if end == "\r" else b"")


def cut(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def decode(make: Callable[[], Decoder], reads: Sequence[bytes]) -> tuple[list[ModelOutput], tuple[Any, ...]]:
    """The deltas of `reads` fed one by one (stopping at a failure, as the reader does), and the
    decoder's final state."""
    decoder = make()
    deltas: list[ModelOutput] = []
    for data in reads:
        deltas += decoder.feed(data)
        if decoder.failure is not None or decoder.done:
            break
    return deltas, (decoder.done, decoder.end_reason(), decoder.finish_reason, decoder.usage, decoder.events,
                    decoder.failure)


def texts(deltas: Sequence[ModelOutput]) -> list[str]:
    assert all(type(d) is ModelDelta for d in deltas)
    return [d.text for d in deltas if type(d) is ModelDelta]


cuts_st = st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=12)
deltas_st = st.lists(st.text(max_size=6), max_size=10)


# -- SSE framing -----------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(events=st.lists(st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\r" not in b), max_size=8),
       end=st.sampled_from(LINE_ENDS), cuts=cuts_st)
def test_framing_finds_the_same_events_however_the_bytes_are_cut(events: list[bytes], end: str,
                                                                 cuts: list[int]) -> None:
    data = b"".join(e + b"\n\n" for e in events)
    frames = SSEFrames()
    blocks = [block for part in cut(with_line_ends(data, end), cuts) for block in frames.feed(part)]
    assert blocks == events
    assert frames.feed(b"") == [] and not frames.oversized


def test_a_crlf_cut_between_its_two_bytes_is_one_line_end() -> None:
    frames = SSEFrames()
    assert frames.feed(b"data: a\r\n\r") == []
    assert frames.feed(b"\ndata: b\r\n\r\n") == [b"data: a", b"data: b"]


def test_a_final_bare_cr_waits_for_the_next_byte() -> None:
    frames = SSEFrames()
    assert frames.feed(b"data: a\r\r") == []   # the last CR may be half a CRLF
    assert frames.feed(b":") == [b"data: a"]


def test_an_unfinished_event_waits_for_the_next_read() -> None:
    frames = SSEFrames()
    assert frames.feed(b"data: a\n\ndata: b") == [b"data: a"]
    assert frames.feed(b"c\n\n") == [b"data: bc"]


def test_fields_join_data_lines_and_skip_comments() -> None:
    assert fields(b"event: error\n: a comment\ndata: {\"a\":\ndata:1}") == (b"error", b'{"a":\n1}')
    assert fields(b"data:x") == (b"", b"x")          # no space after the colon
    assert fields(b": keep-alive") is None              # comments only: no event
    assert fields(b"event: ping") is None               # a name and no data: no event


def test_an_event_that_never_ends_is_dropped_and_reported() -> None:
    frames = SSEFrames()
    assert frames.feed(b"data: " + b"x" * MAX_EVENT_BYTES + b"x") == []
    assert frames.oversized
    decoder = OpenAIChatDecoder()
    decoder.feed(b"data: " + b"x" * (MAX_EVENT_BYTES + 1))
    assert decoder.failure == Fault("connection", OVERSIZED)


# -- OpenAI chat completions -----------------------------------------------------------------------


def openai_events(deltas: Sequence[str], finish: str | None = "stop", *, usage: tuple[int, int] | None = None,
                  keepalives: bool = False, split_json: bool = False, done: bool = True) -> bytes:
    """A chat-completions stream: a role chunk, one chunk per delta, the finish chunk, the usage chunk."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    chunks: list[dict[str, Any]] = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": d}, "finish_reason": None}]} for d in deltas]
    if finish is not None:
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage is not None:
        chunks.append({**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    out = []
    for i, chunk in enumerate(chunks):
        text = json.dumps(chunk, ensure_ascii=False)
        if split_json and i % 2:   # one chunk over two data lines: the general path joins them
            head, tail = text.split(",", 1)
            text = f"{head},\ndata: {tail}"
        out.append(f"data: {text}\n\n")
        if keepalives:
            out.append(": keep-alive\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


@settings(max_examples=80, deadline=None)
@given(deltas=deltas_st, finish=st.sampled_from(["stop", "length", "content_filter", "tool_calls"]),
       usage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), keepalives=st.booleans(),
       split_json=st.booleans(), end=st.sampled_from(LINE_ENDS), cuts=cuts_st)
def test_openai_deltas_and_state_do_not_depend_on_the_cuts(
    deltas: list[str], finish: str, usage: tuple[int, int] | None, keepalives: bool, split_json: bool, end: str,
    cuts: list[int],
) -> None:
    data = with_line_ends(openai_events(deltas, finish, usage=usage, keepalives=keepalives, split_json=split_json), end)
    whole = decode(OpenAIChatDecoder, [data])
    assert decode(OpenAIChatDecoder, cut(data, cuts)) == whole
    got, (done, end_reason, _, reported, events, failure) = whole
    assert texts(got) == [d for d in deltas if d]
    chunks = 1 + len(deltas) + 1 + (usage is not None)
    assert (done, end_reason, reported, events, failure) == (
        True, finish, None if usage is None else Usage(*usage), chunks, None)


def test_openai_byte_by_byte() -> None:
    data = openai_events(["Hel", "lo ", "wörld"], usage=(3, 2), keepalives=True)
    assert decode(OpenAIChatDecoder, [data[i : i + 1] for i in range(len(data))]) == decode(OpenAIChatDecoder, [data])


def test_openai_stream_cut_before_its_finish_has_no_end_reason() -> None:
    got, state = decode(OpenAIChatDecoder, [openai_events(["ab"], finish=None, done=False)])
    assert texts(got) == ["ab"] and state[:2] == (False, None)


@pytest.mark.parametrize("error", [
    b'data: {"error": {"message": "Rate limit reached (429)", "type": "rate_limit"}}\n\n',
    b'event: error\ndata: {"error": {"message": "Rate limit reached (429)", "type": "rate_limit"}}\n\n',
    b'data: {"error": "Rate limit reached (429)"}\n\n',
])
def test_an_openai_error_chunk_ends_the_stream_after_the_deltas_before_it(error: bytes) -> None:
    data = openai_events(["ab", "cd"], finish=None, done=False) + error + openai_events(["never"])
    for reads in ([data], [data[i : i + 7] for i in range(0, len(data), 7)]):
        got, state = decode(OpenAIChatDecoder, reads)
        assert texts(got) == ["ab", "cd"]
        assert state[-1] == Fault("rate_limit", "Rate limit reached (429)")


def test_an_openai_error_code_is_its_status() -> None:
    # vLLM and sglang put the HTTP status in `code`: a 400 is a bad request, not an unmatched `connection`.
    decoder = OpenAIChatDecoder()
    decoder.feed(b'data: {"error": {"message": "bad thing", "code": 400}}\n\n')
    assert decoder.failure == Fault("bad_request", "bad thing")


def test_an_unreadable_openai_event_is_a_connection_fault() -> None:
    decoder = OpenAIChatDecoder()
    assert decoder.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices": nope}\n\n') == [
        ModelDelta("a")]
    assert decoder.failure is not None and decoder.failure.kind == "connection"
    assert decoder.failure.message.startswith("unreadable stream event: ")


# -- Anthropic Messages ----------------------------------------------------------------------------


def untyped(data: bytes) -> bytes:
    """The same events without their `event:` lines: the type is then read from the data."""
    return b"\n".join(line for line in data.split(b"\n") if not line.startswith(b"event: "))


@settings(max_examples=80, deadline=None)
@given(deltas=deltas_st, stop=st.sampled_from(["end_turn", "max_tokens", "stop_sequence", "refusal"]),
       tokens=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), named=st.booleans(),
       end=st.sampled_from(LINE_ENDS), cuts=cuts_st)
def test_anthropic_deltas_and_state_do_not_depend_on_the_cuts(
    deltas: list[str], stop: str, tokens: tuple[int, int], named: bool, end: str, cuts: list[int],
) -> None:
    data = b"".join(transcript_events(deltas, stop_reason=stop, input_tokens=tokens[0], output_tokens=tokens[1]))
    data = with_line_ends(data if named else untyped(data), end)
    whole = decode(AnthropicMessagesDecoder, [data])
    assert decode(AnthropicMessagesDecoder, cut(data, cuts)) == whole
    got, (done, end_reason, _, usage, events, failure) = whole
    assert texts(got) == [d for d in deltas if d]
    # message_start, content_block_start, the deltas, content_block_stop, message_delta, message_stop; not the ping
    assert (done, end_reason, usage, events, failure) == (True, stop, Usage(*tokens), 5 + len(deltas), None)


def test_a_message_stop_without_a_stop_reason_ends_as_stop() -> None:
    _, state = decode(AnthropicMessagesDecoder, [b"".join(transcript_events(["a"], stop_reason=None))])
    assert state[:3] == (True, "stop", None)


def test_an_anthropic_stream_cut_before_message_stop_has_no_end_reason() -> None:
    got, state = decode(AnthropicMessagesDecoder, [b"".join(transcript_events(["a", "b"], end=False))])
    assert texts(got) == ["a", "b"] and state[:2] == (False, None)


@settings(max_examples=40, deadline=None)
@given(cuts=cuts_st)
def test_an_anthropic_error_event_ends_the_stream_with_status_500(cuts: list[int]) -> None:
    data = b"".join(transcript_events(["ab", "cd"], error=("overloaded_error", "Overloaded")))
    data += event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": "never"}})
    got, state = decode(AnthropicMessagesDecoder, cut(data, cuts))
    assert texts(got) == ["ab", "cd"]
    assert state[-1] == Fault("server_error", "Overloaded")


def test_only_text_deltas_are_answer_text() -> None:
    decoder = AnthropicMessagesDecoder()
    data = (event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "input_json_delta", "partial_json": "{\"a\""}})
            + event("some_future_event", {"type": "some_future_event"})
            + event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                            "delta": {"type": "text_delta", "text": "x"}}))
    assert decoder.feed(data) == [ModelDelta("x")]
    assert decoder.failure is None and decoder.events == 3


# -- native function calling: the whole delta family (docs/design.md#native) ---------------------


def native_decode(make: Callable[[], Decoder], reads: Sequence[bytes]) -> tuple[list[ModelOutput], tuple[Any, ...]]:
    decoder = make()
    deltas: list[ModelOutput] = []
    for data in reads:
        deltas += decoder.feed(data)
        if decoder.failure is not None or decoder.done:
            break
    return deltas, (decoder.done, decoder.end_reason(), decoder.usage, decoder.calls, decoder.failure)


@settings(max_examples=150, deadline=None)
@given(message=messages(), field=st.sampled_from(["reasoning_content", "reasoning"]),
       usage=st.none() | st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
       end=st.sampled_from(LINE_ENDS), cuts=cuts_st)
def test_openai_native_deltas_are_the_messages_however_the_bytes_are_cut(
    message: NativeMessage, field: str, usage: tuple[int, int] | None, end: str, cuts: list[int],
) -> None:
    data = with_line_ends(b"".join(native.openai_events(message, reasoning_field=field, usage=usage)), end)
    whole = native_decode(OpenAIChatDecoder, [data])
    assert native_decode(OpenAIChatDecoder, cut(data, cuts)) == whole
    got, (done, end_reason, reported, calls, failure) = whole
    assert merged(got) == expected(message, "openai")
    assert (done, end_reason, reported, calls, failure) == (
        True, message.finish, None if usage is None else Usage(*usage), len(message.calls), None)


@settings(max_examples=150, deadline=None)
@given(message=messages(), named=st.booleans(), end=st.sampled_from(LINE_ENDS), cuts=cuts_st)
def test_anthropic_native_deltas_are_the_messages_however_the_bytes_are_cut(
    message: NativeMessage, named: bool, end: str, cuts: list[int],
) -> None:
    data = b"".join(native.anthropic_events(message, input_tokens=5, output_tokens=9))
    data = with_line_ends(data if named else untyped(data), end)
    whole = native_decode(AnthropicMessagesDecoder, [data])
    assert native_decode(AnthropicMessagesDecoder, cut(data, cuts)) == whole
    got, (done, end_reason, usage, calls, failure) = whole
    assert merged(got) == expected(message, "anthropic")
    assert (done, end_reason, usage, calls, failure) == (
        True, ANTHROPIC_STOP[message.finish], Usage(5, 9), len(message.calls), None)


def test_openai_calls_end_in_index_order_when_the_finish_arrives() -> None:
    # Parallel calls, their fragments interleaved, the last one in the finish chunk itself: the wire
    # never says a call is complete, so the finish ends every started call, lowest index first.
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish}]})}\n\n".encode()

    def frag(index: int, arguments: str, **first: str) -> dict[str, Any]:
        function = {"arguments": arguments, **({"name": first["name"]} if first else {})}
        return {"index": index, **({"id": first["id"], "type": "function"} if first else {}), "function": function}

    data = b"".join([
        chunk({"tool_calls": [frag(1, '{"b"', id="c1", name="beta"), frag(0, "", id="c0", name="alpha")]}),
        chunk({"tool_calls": [frag(0, '{"a": 1}')]}),
        chunk({"tool_calls": [frag(1, ": 2}")]}, "tool_calls"),
        b"data: [DONE]\n\n",
    ])
    decoder = OpenAIChatDecoder()
    assert decoder.feed(data) == [
        ToolCallStart(1, "c1", "beta"), ToolCallArgs(1, '{"b"'), ToolCallStart(0, "c0", "alpha"),
        ToolCallArgs(0, '{"a": 1}'), ToolCallArgs(1, ": 2}"), ToolCallEnd(0), ToolCallEnd(1)]
    assert (decoder.done, decoder.finish_reason, decoder.calls) == (True, "tool_calls", 2)


def test_an_openai_stream_cut_before_its_finish_leaves_its_calls_open() -> None:
    # A cut inside a call's arguments is never a whole call (docs/design.md#native): no end is made up.
    message = NativeMessage((Call("c", "f", ('{"a":', ' 1}')),), "tool_calls")
    data = b"".join(native.openai_events(message)[:-2])   # no finish chunk, no [DONE]
    got, (done, end_reason, *_) = native_decode(OpenAIChatDecoder, [data])
    assert merged(got) == [ToolCallStart(0, "c", "f"), ToolCallArgs(0, '{"a": 1}')]
    assert (done, end_reason) == (False, None)


def test_reasoning_takes_the_reasoning_field_first_as_litellm_does() -> None:
    decoder = OpenAIChatDecoder()
    data = (b'data: {"choices":[{"delta":{"reasoning":"a","reasoning_content":"a"}}]}\n\n'
            b'data: {"choices":[{"delta":{"reasoning_content":"b","content":"c"}}]}\n\n')
    assert decoder.feed(data) == [ReasoningDelta("a"), ReasoningDelta("b"), ModelDelta("c")]


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return event("content_block_start", {"type": "content_block_start", "index": index, "content_block": block})


def block_stop(index: int) -> bytes:
    return event("content_block_stop", {"type": "content_block_stop", "index": index})


def test_what_an_anthropic_start_block_holds_is_its_first_fragment() -> None:
    # Anthropic streams start blocks empty; one that is not (a proxy that replays a whole message)
    # loses nothing. LiteLLM's reader drops all but the text: tests/test_llm_native.py.
    data = b"".join([
        block_start(0, {"type": "thinking", "thinking": "hm", "signature": "S1"}), block_stop(0),
        block_start(1, {"type": "text", "text": "Hi"}), block_stop(1),
        block_start(2, {"type": "tool_use", "id": "t", "name": "f", "input": {"city": "Paris"}}),
        event("content_block_delta", {"type": "content_block_delta", "index": 2,
                                      "delta": {"type": "input_json_delta", "partial_json": ""}}),
        block_stop(2),
    ])
    assert AnthropicMessagesDecoder().feed(data) == [
        ReasoningDelta("hm"), ReasoningSignature("S1"), ModelDelta("Hi"),
        ToolCallStart(0, "t", "f"), ToolCallArgs(0, '{"city":"Paris"}'), ToolCallEnd(0)]


def test_one_signature_per_thinking_block_after_its_text() -> None:
    # The turn sends each block back as it came (actors/native.thinking_blocks): text, then signature.
    def delta(kind: str, **fields: str) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": kind, **fields}})

    data = b"".join([block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
                     delta("thinking_delta", thinking="a"), delta("signature_delta", signature="S"),
                     delta("signature_delta", signature="IG"), block_stop(0)])
    assert AnthropicMessagesDecoder().feed(data) == [ReasoningDelta("a"), ReasoningSignature("SIG")]


def test_a_tool_use_block_left_open_ends_before_the_message_does() -> None:
    data = b"".join([
        block_start(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}}),
        event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "input_json_delta", "partial_json": "{}"}}),
        event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}}),
    ])
    assert AnthropicMessagesDecoder().feed(data) == [ToolCallStart(0, "t", "f"), ToolCallArgs(0, "{}"), ToolCallEnd(0)]
