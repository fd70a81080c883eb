"""Native function calling through the model layer (docs/design.md#native): the request a native round
sends, and every reader yielding the same deltas for the same stream.

The decoders are checked on bytes cut anywhere in tests/test_llm_wire.py; here, whole calls over
loopback HTTP: the fast reader and LiteLLM's wrapper reader (`stream_reader = "litellm"`) read the
same SSE, in both wire formats (`openai/…` and `anthropic/…` with `api_base` at the server), and
must yield the same merged deltas and finish. Where LiteLLM's wrapper cannot carry what the wire
said, the test that pins it says so (actors/llm/litellm_reader.py lists them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.llm.call import STREAM_READER, ModelCall
from actors.llm.deltas import ModelFinished
from actors.llm.fast import fast_stream
from actors.llm.litellm_reader import litellm_stream
from actors.llm.request import build_request, fast_path_supports
from actors.llm.stream import reader_for
from actors.llm.transport import aclose_sessions
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    merged,
)
from tests.fixtures.anthropic_sse import Served, event, serve
from tests.fixtures.native_sse import (
    Call,
    NativeMessage,
    Reasoning,
    Redacted,
    Text,
    anthropic_events,
    expected,
    expected_finish,
    openai_events,
)
from tests.native_strategies import messages

KEY = "sk-test-0123456789"
CLAUDE = "anthropic/claude-sonnet-4-5"
WIRES = {"openai": ("openai/x", "/v1"), "anthropic": (CLAUDE, "")}
WEATHER: dict[str, Any] = {"type": "function", "function": {
    "name": "demo_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(autouse=True)
async def _close_pooled_session() -> AsyncIterator[None]:
    yield
    await aclose_sessions()   # the pool belongs to this test's event loop


def call_for(model: str, base: str, *, reader: str = "fast", messages: Sequence[dict[str, Any]] | None = None,
             tools: Sequence[dict[str, Any]] = (WEATHER,)) -> ModelCall:
    return ModelCall.resolve(model, messages or [{"role": "user", "content": "weather in paris?"}],
                             {STREAM_READER: reader}, conversation_id="conv", call_index=0, api_base=base,
                             api_key=KEY, max_tokens=256, include_usage=True, tools=tools)


async def read(call: ModelCall) -> tuple[list[ModelOutput], ModelFinished]:
    reader = fast_stream if call.reader == "fast" else litellm_stream
    items = [item async for item in reader(call)]
    finish = items.pop()
    assert type(finish) is ModelFinished
    return items, finish  # type: ignore[return-value]


def sse_app(events: Callable[[], Sequence[bytes]], served: Served | None = None, cuts: Sequence[int] = ()
            ) -> web.Application:
    """Both wires' endpoints, answering with `events()`' bytes written in pieces cut at `cuts`."""

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if served is not None:
            served.requests.append((dict(request.headers), body))
        data = b"".join(events())
        points = sorted({c % (len(data) + 1) for c in cuts})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for a, b in zip([0, *points], [*points, len(data)], strict=True):
            if data[a:b]:
                await response.write(data[a:b])
                await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1/messages", answer)
    return app


async def both_readers(wire: str, events: Callable[[], Sequence[bytes]], cuts: Sequence[int] = ()
                       ) -> tuple[tuple[list[ModelOutput], ModelFinished], tuple[list[ModelOutput], ModelFinished]]:
    model, path = WIRES[wire]
    runner, port = await serve(sse_app(events, cuts=cuts))
    base = f"http://127.0.0.1:{port}{path}"
    try:
        return await read(call_for(model, base)), await read(call_for(model, base, reader="litellm"))
    finally:
        await runner.cleanup()


def wire_events(wire: str, message: NativeMessage) -> list[bytes]:
    return openai_events(message, usage=(11, 7)) if wire == "openai" else anthropic_events(message)


def ends_at_the_finish(deltas: Sequence[ModelOutput]) -> list[ModelOutput]:
    """`deltas` with every call ended at the message's end, in index order. LiteLLM's wrapper does
    not carry Anthropic's `content_block_stop`: its reader ends the calls at the finish, as on the
    OpenAI wire. The calls and their arguments are the same; only the point where each closes moves
    (the native decoder closes the action there, after any content that followed it)."""
    ends = sorted((d for d in deltas if type(d) is ToolCallEnd), key=lambda d: d.index)
    return merged([*(d for d in deltas if type(d) is not ToolCallEnd), *ends])


def as_litellm_carries(wire: str, deltas: Sequence[ModelOutput]) -> list[ModelOutput]:
    return ends_at_the_finish(deltas) if wire == "anthropic" else merged(deltas)


# -- the same deltas from every reader -----------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=messages(), wire=st.sampled_from(sorted(WIRES)),
       cuts=st.lists(st.integers(min_value=0, max_value=1 << 14), max_size=6))
async def test_litellms_wrapper_yields_the_fast_readers_deltas(message: NativeMessage, wire: str,
                                                               cuts: list[int]) -> None:
    (fast, fast_end), (lite, lite_end) = await both_readers(wire, lambda: wire_events(wire, message), cuts)
    assert merged(fast) == expected(message, wire)
    assert merged(lite) == as_litellm_carries(wire, fast)
    assert fast_end.finish_reason == lite_end.finish_reason == expected_finish(message)
    if wire == "openai":   # LiteLLM reports no usage for a stream without `stream_options`: lite.LEAN_SETTINGS
        assert fast_end.usage == lite_end.usage


async def test_a_whole_anthropic_tool_round_reads_the_same_on_both_readers() -> None:
    # The shape the turn meets most: signed thinking, a redacted block, a preamble, two calls.
    message = NativeMessage((
        Reasoning(("The user wants ", "the weather."), "EqQBCkYIBxgCKkA="), Redacted("RXJyb3IgcmVkYWN0ZWQ="),
        Text(("I'll check ", "both cities.")),
        Call("toolu_01", "demo_weather", ("", '{"ci', 'ty": "Pa', 'ris"}')),
        Call("toolu_02", "demo_weather", ('{"city": "Lyon"}',)),
    ), "tool_calls")
    (fast, fast_end), (lite, lite_end) = await both_readers("anthropic", lambda: anthropic_events(message))
    said = [ReasoningDelta("The user wants the weather."), ReasoningSignature("EqQBCkYIBxgCKkA="),
            RedactedReasoning("RXJyb3IgcmVkYWN0ZWQ="), ModelDelta("I'll check both cities."),
            ToolCallStart(0, "toolu_01", "demo_weather"), ToolCallArgs(0, '{"city": "Paris"}')]
    assert merged(fast) == [*said, ToolCallEnd(0), ToolCallStart(1, "toolu_02", "demo_weather"),
                            ToolCallArgs(1, '{"city": "Lyon"}'), ToolCallEnd(1)]
    # through LiteLLM, both calls end at the finish: it does not carry the blocks' stops
    assert merged(lite) == [*said, ToolCallStart(1, "toolu_02", "demo_weather"), ToolCallArgs(1, '{"city": "Lyon"}'),
                            ToolCallEnd(0), ToolCallEnd(1)]
    assert fast_end.finish_reason == lite_end.finish_reason == "tool_calls"


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_openai_reasoning_reads_the_same_under_either_name(field: str) -> None:
    message = NativeMessage((Reasoning(("hm", "m.")), Text(("Sunny.",))), "stop")
    (fast, _), (lite, _) = await both_readers("openai", lambda: openai_events(message, reasoning_field=field))
    assert merged(fast) == merged(lite) == [ReasoningDelta("hmm."), ModelDelta("Sunny.")]


@pytest.mark.parametrize("wire", sorted(WIRES))
async def test_a_call_that_says_stop_finishes_in_tool_calls_on_both_readers(wire: str) -> None:
    # Some OpenAI-compatible servers end a tool-calling message with `stop`; LiteLLM's wrapper
    # reports `tool_calls`, and so does the fast reader.
    message = NativeMessage((Call("c", "demo_weather", ('{"city": "Paris"}',)),), "stop")
    (_, fast_end), (_, lite_end) = await both_readers(wire, lambda: wire_events(wire, message))
    assert fast_end.finish_reason == lite_end.finish_reason == "tool_calls"


# -- what LiteLLM's wrapper cannot carry ---------------------------------------------------------


def start_blocks_with_content() -> list[bytes]:
    """Start blocks that already hold their content, as no Anthropic stream sends them (a proxy
    replaying a whole message might)."""
    def block(i: int, start: dict[str, Any]) -> list[bytes]:
        return [event("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                event("content_block_stop", {"type": "content_block_stop", "index": i})]

    return [
        event("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 1, "output_tokens": 1}}}),
        *block(0, {"type": "thinking", "thinking": "hm", "signature": "S1"}),
        *block(1, {"type": "text", "text": "Paris: "}),
        *block(2, {"type": "tool_use", "id": "t", "name": "demo_weather", "input": {"city": "Paris"}}),
        event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {}}),
        event("message_stop", {"type": "message_stop"}),
    ]


async def test_litellm_drops_what_an_anthropic_start_block_holds_but_its_text() -> None:
    # LiteLLM's Anthropic iterator starts a tool call with arguments "" whatever `input` says, and
    # reads thinking and signatures only from deltas: no reader of ours can get them back from it.
    (fast, _), (lite, _) = await both_readers("anthropic", start_blocks_with_content)
    assert merged(fast) == [ReasoningDelta("hm"), ReasoningSignature("S1"), ModelDelta("Paris: "),
                            ToolCallStart(0, "t", "demo_weather"), ToolCallArgs(0, '{"city":"Paris"}'), ToolCallEnd(0)]
    assert merged(lite) == [ModelDelta("Paris: "), ToolCallStart(0, "t", "demo_weather"), ToolCallEnd(0)]


async def test_a_tool_use_block_with_no_input_delta_has_no_arguments_through_litellm() -> None:
    # LiteLLM writes `{}` for a tool_use block whose input deltas were all empty (as the fast reader
    # does), but nothing for one with no input delta at all; the native decoder reads both as {}.
    def events() -> list[bytes]:
        return [e for e in anthropic_events(NativeMessage((Call("t", "demo_clock", ()),), "tool_calls"))
                if b"input_json_delta" not in e]

    (fast, _), (lite, _) = await both_readers("anthropic", events)
    assert merged(fast) == [ToolCallStart(0, "t", "demo_clock"), ToolCallArgs(0, "{}"), ToolCallEnd(0)]
    assert merged(lite) == [ToolCallStart(0, "t", "demo_clock"), ToolCallEnd(0)]


# -- the request ---------------------------------------------------------------------------------


# A native round's history as the turn writes it (actors/native.py, ids by `history_id`): an
# assistant message with its thinking blocks, a preamble and a call; the call's tool message; a call
# with no content; its answer; and the answer so far as the last assistant message — an Anthropic
# prefill.
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are the demo agent."},
    {"role": "user", "content": "Weather in Paris and Lyon?"},
    {"role": "assistant", "content": "I'll check Paris first.",
     "thinking_blocks": [{"type": "thinking", "thinking": "Two cities.", "signature": "SIG-1=="},
                         {"type": "redacted_thinking", "data": "REDACTED-1=="}],
     "tool_calls": [{"id": "t1_1_0", "type": "function",
                     "function": {"name": "demo_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "t1_1_0", "content": '{"temp_c": 12}'},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "t1_2_0", "type": "function",
                     "function": {"name": "demo_weather", "arguments": '{"city": "Lyon"}'}}]},
    {"role": "tool", "tool_call_id": "t1_2_0", "content": '{"temp_c": 15}'},
    {"role": "assistant", "content": "Paris is 12 °C and Lyon"},
]


def sent_body(model: str, base: str = "http://127.0.0.1:1") -> dict[str, Any]:
    body: dict[str, Any] = json.loads(build_request(call_for(model, base, messages=HISTORY)).body)
    return body


def test_a_call_with_tools_takes_the_fast_path() -> None:
    for model, path in WIRES.values():
        call = call_for(model, f"http://127.0.0.1:1{path}", messages=HISTORY)
        assert fast_path_supports(call) and reader_for(call) == "fast"


def test_the_anthropic_request_carries_the_native_history() -> None:
    body = sent_body(CLAUDE)
    assert body["tools"] == [{"name": "demo_weather", "description": "The weather in a city.",
                              "input_schema": WEATHER["function"]["parameters"], "type": "custom"}]
    assert body["system"] == [{"type": "text", "text": "You are the demo agent."}]
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    first, answered, second, answered_again, prefill = body["messages"][1:]
    # the thinking blocks go back first and unchanged, signatures and redacted data as they came
    assert first["content"] == [
        {"type": "thinking", "thinking": "Two cities.", "signature": "SIG-1=="},
        {"type": "redacted_thinking", "data": "REDACTED-1=="},
        {"type": "text", "text": "I'll check Paris first."},
        {"type": "tool_use", "id": "t1_1_0", "name": "demo_weather", "input": {"city": "Paris"}}]
    assert answered["content"] == [{"type": "tool_result", "tool_use_id": "t1_1_0", "content": '{"temp_c": 12}'}]
    assert second["content"] == [{"type": "tool_use", "id": "t1_2_0", "name": "demo_weather", "input": {"city": "Lyon"}}]
    assert answered_again["content"] == [{"type": "tool_result", "tool_use_id": "t1_2_0", "content": '{"temp_c": 15}'}]
    assert prefill["content"] == [{"type": "text", "text": "Paris is 12 °C and Lyon"}]   # the prefill, last


def test_the_openai_request_carries_the_native_history_as_it_is() -> None:
    body = sent_body("openai/x", "http://127.0.0.1:1/v1")
    assert body["tools"] == [WEATHER]
    sent = body["messages"]
    assert [m["role"] for m in sent] == [m["role"] for m in HISTORY]
    assert [m.get("tool_calls") for m in sent] == [m.get("tool_calls") for m in HISTORY]
    assert [m.get("tool_call_id") for m in sent] == [m.get("tool_call_id") for m in HISTORY]
    assert "content" not in sent[4] and sent[-1] == HISTORY[-1]   # None fields dropped, as LiteLLM does


@pytest.mark.parametrize("wire", sorted(WIRES))
async def test_the_native_request_is_the_one_litellm_sends(wire: str) -> None:
    model, path = WIRES[wire]
    served = Served()
    message = NativeMessage((Text(("ok",)),), "stop")
    runner, port = await serve(sse_app(lambda: wire_events(wire, message), served=served))
    base = f"http://127.0.0.1:{port}{path}"
    try:
        for reader in ("fast", "litellm"):
            await read(call_for(model, base, reader=reader, messages=HISTORY))
    finally:
        await runner.cleanup()
    (_, fast_body), (_, lite_body) = served.requests
    assert fast_body == lite_body
    assert fast_body["tools"] and fast_body["messages"][-1]["role"] == "assistant"
