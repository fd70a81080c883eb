"""The fast stream path (actors/llm/fast.py): the same answers, finish reasons and error kinds as
LiteLLM's stream wrapper, read off the wire by us (docs/design.md#fallback).

The decoders are checked on byte strings cut anywhere (here, and in tests/test_llm_wire.py); the
whole path against `reactgate mock-llm`
(OpenAI-compatible SSE) and a recorded Anthropic Messages stream on loopback, each next to
`litellm.acompletion(stream=True)` on the same server.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.llm.anthropic_wire import AnthropicMessagesDecoder
from actors.llm.call import STREAM_READER, ModelCall
from actors.llm.deltas import ModelFinished
from actors.llm.errors import STATUS_KINDS, ErrorKind, ProviderError, Usage, classify, error_kind
from actors.llm.fast import Decoder, fast_stream
from actors.llm.lite import litellm_module
from actors.llm.mock_server import STATS, start_mock_server
from actors.llm.openai_wire import OpenAIChatDecoder
from actors.llm.request import FAST_SETTINGS, build_request, fast_path_supports
from actors.llm.scripts import CALL_INDEX_HEADER, CONVERSATION_HEADER, Round, Script
from actors.llm.transport import aclose_sessions
from actors.llm.wires import PROVIDER_WIRES, Wire
from protocol.deltas import ModelDelta
from tests.fixtures.anthropic_sse import (
    RECORDED,
    RECORDED_TEXT,
    RECORDED_USAGE,
    Served,
    messages_app,
    serve,
    transcript,
    transcript_events,
)
from tests.kit import wait_until

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather in paris?"}]
HEADERS = {CONVERSATION_HEADER: "conv", CALL_INDEX_HEADER: "0"}
KEY = "sk-test-0123456789"
CLAUDE = "anthropic/claude-sonnet-4-5"


@pytest.fixture(autouse=True)
async def _close_pooled_session() -> AsyncIterator[None]:
    yield
    await aclose_sessions()   # the pool belongs to this test's event loop


@dataclass(frozen=True)
class Outcome:
    """What a caller of either path sees: the text, then a finish reason or an error kind."""

    text: str
    finish: str | None = None
    error: str | None = None
    after_first_delta: bool | None = None


def attempt(model: str, *, settings: dict[str, Any] | None = None, api_key: str | None = KEY,
            include_usage: bool = True, conversation_id: str = "conv", call_index: int = 0, **kw: Any) -> ModelCall:
    """The call `stream_model` would make (HEADERS: conversation "conv", call 0), usage asked for."""
    return ModelCall.resolve(model, MESSAGES, settings or {}, conversation_id=conversation_id, call_index=call_index,
                             api_key=api_key, include_usage=include_usage, **kw)


async def fast_outcome(model: str, api_base: str, **kw: Any) -> tuple[Outcome, list[Any]]:
    items: list[Any] = []
    try:
        async for item in fast_stream(attempt(model, api_base=api_base, **kw)):
            items.append(item)
    except ProviderError as exc:
        text = "".join(i.text for i in items)
        return Outcome(text, error=exc.kind, after_first_delta=exc.after_first_delta), items
    assert all(type(i) is ModelDelta for i in items[:-1]) and type(items[-1]) is ModelFinished
    return Outcome("".join(i.text for i in items[:-1]), finish=items[-1].finish_reason), items


async def litellm_outcome(model: str, api_base: str, **kw: Any) -> Outcome:
    """LiteLLM's wrapper on the same server, read as `stream_model` reads it."""
    litellm = litellm_module()
    text, finish = "", None
    stream: Any = None
    try:
        stream = await litellm.acompletion(model=model, messages=MESSAGES, stream=True, api_base=api_base,
                                           api_key=KEY, extra_headers=HEADERS, max_retries=0, num_retries=0, **kw)
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                if chunk.choices[0].finish_reason is not None:
                    finish = chunk.choices[0].finish_reason
                    break
    except Exception as exc:
        return Outcome(text, error=error_kind(exc), after_first_delta=bool(text))
    finally:
        if stream is not None:
            await stream.aclose()
    return Outcome(text, finish=finish)


def script(*rounds: Round) -> Script:
    return Script(rounds=rounds)


async def both(played: Script, model: str = "openai/x", **kw: Any) -> tuple[Outcome, Outcome]:
    runner, port = await start_mock_server(played)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        fast, _ = await fast_outcome(model, base, **kw)
        lite = await litellm_outcome(model, base, **({"timeout": kw["timeout_s"]} if "timeout_s" in kw else {}))
    finally:
        await runner.cleanup()
    return fast, lite


# -- the readers, on bytes -----------------------------------------------------------------------


def openai_stream(deltas: Sequence[str], finish: str = "stop", *, usage: tuple[int, int] | None = None,
                  crlf: bool = False) -> bytes:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": d}, "finish_reason": None}]} for d in deltas]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if usage is not None:
        events.append({**base, "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events) + "data: [DONE]\n\n"
    return (body.replace("\n", "\r\n") if crlf else body).encode()


def read_all(reader: Decoder, data: bytes, cuts: Sequence[int] = ()) -> list[str]:
    texts: list[str] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        texts += [delta.text for delta in reader.feed(data[start:cut])]
        start = cut
    return texts


texts_st = st.lists(st.text(min_size=1, max_size=6), max_size=12)
cuts_st = st.lists(st.integers(min_value=0, max_value=4000), max_size=8)


@settings(max_examples=40, deadline=None)
@given(deltas=texts_st, cuts=cuts_st, crlf=st.booleans())
def test_openai_reader_yields_the_same_deltas_however_the_bytes_are_cut(
    deltas: list[str], cuts: list[int], crlf: bool
) -> None:
    data = openai_stream(deltas, "length", usage=(7, 3), crlf=crlf)
    reader = OpenAIChatDecoder()
    assert read_all(reader, data, [c % (len(data) + 1) for c in cuts]) == [d for d in deltas if d]
    assert (reader.done, reader.failure, reader.finish_reason, reader.usage) == (True, None, "length", Usage(7, 3))


@settings(max_examples=40, deadline=None)
@given(cuts=cuts_st)
def test_anthropic_reader_yields_the_recorded_text_however_the_bytes_are_cut(cuts: list[int]) -> None:
    data = RECORDED.read_bytes()
    reader = AnthropicMessagesDecoder()
    assert "".join(read_all(reader, data, [c % (len(data) + 1) for c in cuts])) == RECORDED_TEXT
    assert (reader.done, reader.finish_reason, reader.usage) == (True, "end_turn", Usage(*RECORDED_USAGE))


def test_keepalives_role_chunks_and_empty_deltas_yield_nothing() -> None:
    reader = OpenAIChatDecoder()
    data = (b": keep-alive\n\n" b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
            b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n' b": ping\n\n"
            b'data:{"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n')   # `data:` without its space
    assert reader.feed(data) == [ModelDelta("x")]
    assert reader.events == 3   # the comments are keep-alives: the idle timer does not count them


def test_an_error_event_ends_the_stream_after_the_deltas_before_it() -> None:
    reader = OpenAIChatDecoder()
    data = openai_stream(["ab", "cd"]).split(b'data: {"id": "chatcmpl-1", "object": "chat.completion.chunk", '
                                             b'"created": 0, "model": "m", "choices": [{"index": 0, "delta": {}')[0]
    data += b'event: error\ndata: {"error": {"message": "Rate limit reached (429)", "type": "rate_limit"}}\n\n'
    assert reader.feed(data) == [ModelDelta("ab"), ModelDelta("cd")]
    assert reader.failure is not None and (reader.failure.kind, reader.failure.message) == (
        "rate_limit", "Rate limit reached (429)")


@pytest.mark.parametrize(("stop_reason", "finish"), [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"), ("refusal", "content_filter"),
])
async def test_anthropic_stop_reasons_finish_in_openai_vocabulary(stop_reason: str, finish: str) -> None:
    runner, port = await serve(messages_app(lambda: transcript_events(["a", "b"], stop_reason=stop_reason)))
    try:
        outcome, _ = await fast_outcome(CLAUDE, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert outcome == Outcome("ab", finish=finish)


def test_status_kinds_per_wire() -> None:
    """The cells LiteLLM 1.110 gives (test_http_statuses_map_like_litellm checks them against it)."""
    assert dict(STATUS_KINDS[Wire.OPENAI_CHAT]) == {
        400: "bad_request", 401: "auth", 404: "not_found", 408: "timeout", 422: "bad_request", 429: "rate_limit",
        500: "server_error", 502: "server_error", 503: "unavailable", 504: "timeout"}
    assert dict(STATUS_KINDS[Wire.ANTHROPIC_MESSAGES]) == {
        400: "bad_request", 401: "auth", 403: "auth", 404: "not_found", 408: "timeout", 413: "bad_request",
        429: "rate_limit", 500: "server_error", 502: "server_error", 503: "unavailable", 504: "timeout",
        529: "server_error"}
    assert (classify(Wire.OPENAI_CHAT, 403, "x"), classify(Wire.ANTHROPIC_MESSAGES, 409, "x")) == (
        "server_error", "bad_request")
    assert classify(Wire.OPENAI_CHAT, None, "scripted auth") == "connection"   # mid-stream, unmatched


def test_the_provider_set() -> None:
    assert {p for p, w in PROVIDER_WIRES.items() if w is Wire.OPENAI_CHAT} == {
        "openai", "hosted_vllm", "together_ai", "deepseek", "litellm_proxy", "lm_studio", "deepinfra", "cerebras",
        "nvidia_nim"}
    assert {p for p, w in PROVIDER_WIRES.items() if w is Wire.ANTHROPIC_MESSAGES} == {"anthropic"}


@pytest.mark.parametrize(("model", "model_settings", "api_base", "expected"), [
    ("openai/gpt-4o-mini", {}, None, True),
    ("openai/x", {"temperature": 0.2, "api_key_env": "K", STREAM_READER: "fast"}, "http://h/v1", True),
    (CLAUDE, {"max_tokens": 100}, None, True),
    ("hosted_vllm/m", {"api_base": "http://vllm:8000/v1"}, None, True),
    ("hosted_vllm/m", {}, None, False),               # no endpoint to name: LiteLLM reads its variables
    ("openai/o1-pro", {}, None, False),               # LiteLLM bridges it to the Responses API
    ("openai/x", {STREAM_READER: "litellm"}, None, False),
    ("openai/x", {"tools": []}, None, False),          # a parameter the fast path does not re-implement
    ("scripted/demo", {}, None, False),
    ("groq/llama-3.1-8b-instant", {}, None, False),   # its own stream iterator in LiteLLM
    ("azure/my-deployment", {}, None, False),
    ("ollama_chat/llama3", {}, None, False),
    ("not-a-provider/x", {}, None, False),
])
def test_which_calls_take_the_fast_path(model: str, model_settings: dict[str, Any], api_base: str | None,
                                        expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    litellm_module()
    monkeypatch.setenv("K", "sk-k")   # the key variable the settings name, read when the call is resolved
    assert fast_path_supports(attempt(model, settings=model_settings, api_key=None, api_base=api_base)) is expected


def test_the_reader_setting_never_reaches_litellm() -> None:
    assert attempt("openai/x", settings={STREAM_READER: "litellm", "temperature": 0.1}).params == {"temperature": 0.1}
    assert STREAM_READER in FAST_SETTINGS


# -- against reactgate mock-llm, next to LiteLLM's wrapper ---------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(deltas=st.lists(st.text(max_size=5), min_size=1, max_size=10),
       finish=st.sampled_from(["stop", "length", "content_filter"]))
async def test_fast_path_and_litellm_stream_the_same_text_and_finish(deltas: list[str], finish: str) -> None:
    fast, lite = await both(script(Round(deltas=tuple(deltas), finish_reason=finish)))  # type: ignore[arg-type]
    assert fast == lite == Outcome("".join(deltas), finish=finish)


async def test_a_length_finish_streams_the_same_on_both_paths() -> None:
    fast, lite = await both(script(Round(text="cut off in the midd", chunk_chars=4, finish_reason="length")))
    assert fast == lite == Outcome("cut off in the midd", finish="length")


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_errors_before_the_first_delta_map_like_litellm(kind: ErrorKind) -> None:
    fast, lite = await both(script(Round(error=kind)))
    assert fast == lite == Outcome("", error=kind.value, after_first_delta=False)


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_errors_mid_stream_map_like_litellm(kind: ErrorKind) -> None:
    # auth, not_found and unavailable: no provider reports them mid-stream; both read `connection`.
    fast, lite = await both(script(Round(deltas=("ab", "cd"), error=kind)))
    expected = kind.value if kind in (ErrorKind.RATE_LIMIT, ErrorKind.TIMEOUT, ErrorKind.SERVER_ERROR,
                                      ErrorKind.BAD_REQUEST) else "connection"
    assert fast == lite == Outcome("abcd", error=expected, after_first_delta=True)


async def test_an_exhausted_script_is_script_exhausted_on_both_paths() -> None:
    runner, port = await start_mock_server(script(Round(text="once")))
    base = f"http://127.0.0.1:{port}/v1"
    try:
        with pytest.raises(ProviderError) as err:
            async for _ in fast_stream(attempt("openai/x", conversation_id="c", call_index=1, api_base=base)):
                pass
    finally:
        await runner.cleanup()
    assert (err.value.kind, err.value.after_first_delta) == ("script_exhausted", False)


def status_app(status: int, wire: Wire) -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        body: dict[str, Any] = ({"error": {"message": "boom", "type": "x", "code": "x"}} if wire is Wire.OPENAI_CHAT
                                else {"type": "error", "error": {"type": "api_error", "message": "boom"}})
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1/messages", answer)
    return app


@pytest.mark.parametrize("wire", list(Wire))
@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 529])
async def test_http_statuses_map_like_litellm(status: int, wire: Wire) -> None:
    runner, port = await serve(status_app(status, wire))
    model, base = ("openai/x", f"http://127.0.0.1:{port}/v1") if wire is Wire.OPENAI_CHAT else (
        CLAUDE, f"http://127.0.0.1:{port}")
    try:
        fast, _ = await fast_outcome(model, base, max_tokens=10)
        lite = await litellm_outcome(model, base, max_tokens=10)
    finally:
        await runner.cleanup()
    assert fast == lite
    assert fast.error == classify(wire, status, "boom")


async def test_closing_early_aborts_the_generation() -> None:
    runner, port = await start_mock_server(script(Round(text="z" * 2000, chunk_chars=1, delay_ms=2)))
    stats = runner.app[STATS]
    try:
        got: list[Any] = []
        gen = fast_stream(attempt("openai/x", api_base=f"http://127.0.0.1:{port}/v1"))
        async with aclosing(gen):
            async for item in gen:
                got.append(item)
                if len(got) == 3:
                    break
        await stats.wait_until(lambda s: s.streams_aborted == 1)
        assert stats.streams_completed == 0
        assert got == [ModelDelta("z")] * 3
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("hang_after", [1, 2])   # mid-answer, and after the last delta (no finish)
async def test_a_provider_gone_silent_is_cut_by_the_idle_timeout(hang_after: int) -> None:
    runner, port = await start_mock_server(script(Round(deltas=("ab", "cd"), hang_after=hang_after)))
    stats = runner.app[STATS]
    try:
        fast, _ = await fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1", idle_timeout_s=0.3)
        await stats.wait_until(lambda s: s.streams_aborted == 1)   # and the hanging response is closed
    finally:
        await runner.cleanup()
    assert fast == Outcome("abcd"[: 2 * hang_after], error="timeout", after_first_delta=True)


async def test_time_spent_by_the_consumer_does_not_count_as_silence() -> None:
    runner, port = await start_mock_server(script(Round(deltas=("ab", "cd", "ef"))))
    try:
        got: list[Any] = []
        async for item in fast_stream(attempt("openai/x", idle_timeout_s=0.1, api_base=f"http://127.0.0.1:{port}/v1")):
            got.append(item)
            await asyncio.sleep(0.25)   # the round engine busy with a delta, longer than the idle timeout
    finally:
        await runner.cleanup()
    assert [i.text for i in got[:-1]] == ["ab", "cd", "ef"] and got[-1].finish_reason == "stop"


def sse_app(body: Callable[[web.StreamResponse], Awaitable[None]]) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await body(response)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_keepalives_alone_do_not_hold_off_the_idle_timeout() -> None:
    async def pings_forever(response: web.StreamResponse) -> None:
        await response.write(openai_stream(["ab"]).split(b"\n\n")[1] + b"\n\n")
        while True:
            await response.write(b": keep-alive\n\n")
            await asyncio.sleep(0.05)

    runner, port = await serve(sse_app(pings_forever))
    try:
        outcome, _ = await fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1", idle_timeout_s=0.3)
    finally:
        await runner.cleanup()
    assert outcome == Outcome("ab", error="timeout", after_first_delta=True)


async def test_a_body_held_open_after_done_does_not_hold_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("actors.llm.fast.DRAIN_S", 0.1)

    async def done_then_hold(response: web.StreamResponse) -> None:
        await response.write(openai_stream(["ab"]))
        await asyncio.sleep(30)

    runner, port = await serve(sse_app(done_then_hold))
    try:
        outcome, _ = await asyncio.wait_for(fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1"), 5)
    finally:
        await runner.cleanup()
    assert outcome == Outcome("ab", finish="stop")


async def test_no_first_byte_within_the_timeout_is_a_timeout() -> None:
    fast, lite = await both(script(Round(deltas=("late",), delay_ms=3000)), timeout_s=0.2)
    assert fast == lite == Outcome("", error="timeout", after_first_delta=False)


async def test_usage_is_reported_when_the_provider_sends_it() -> None:
    runner, port = await start_mock_server(script(Round(text="Hello world")))
    try:
        _, items = await fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1")
        _, without = await fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1", include_usage=False)
    finally:
        await runner.cleanup()
    assert items[-1].usage is not None and items[-1].usage.completion_tokens > 0
    assert without[-1] == ModelFinished("stop", "openai/x", None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("model", "path"), [("openai/x", "/v1"), (CLAUDE, "")])
async def test_a_refused_connection_maps_like_litellm(model: str, path: str) -> None:
    base = f"http://127.0.0.1:{free_port()}{path}"
    fast, _ = await fast_outcome(model, base, max_tokens=10)
    lite = await litellm_outcome(model, base, max_tokens=10)
    assert fast == lite == Outcome("", error="server_error", after_first_delta=False)   # LiteLLM's word for it


async def test_a_connection_dropped_mid_stream_is_connection_on_both_paths() -> None:
    async def drop(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(openai_stream(["ab", "cd"]).split(b"\n\n", 3)[0] + b"\n\n")
        await response.write(openai_stream(["ab", "cd"]).split(b"\n\n", 3)[1] + b"\n\n")
        assert request.transport is not None
        while request.transport.get_write_buffer_size():  # both deltas are on the socket before the drop
            await asyncio.sleep(0)
        request.transport.abort()   # the provider's process dies mid-answer
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", drop)
    runner, port = await serve(app)
    try:
        fast, _ = await fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1")
        lite = await litellm_outcome("openai/x", f"http://127.0.0.1:{port}/v1")
    finally:
        await runner.cleanup()
    assert fast == lite == Outcome("ab", error="connection", after_first_delta=True)


async def test_one_connection_serves_consecutive_calls() -> None:
    peers: list[Any] = []

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.Response(body=openai_stream(["ok"]), content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner, port = await serve(app)
    try:
        for _ in range(3):
            outcome, _ = await fast_outcome("openai/x", f"http://127.0.0.1:{port}/v1")
            assert outcome == Outcome("ok", finish="stop")
    finally:
        await runner.cleanup()
    assert len(set(peers)) == 1   # the body read to its end, the connection went back to the pool


# -- the request LiteLLM would send --------------------------------------------------------------


def capture_app(served: Served) -> web.Application:
    async def record(request: web.Request) -> web.Response:
        served.requests.append((dict(request.headers), await request.json()))
        if request.path.endswith("/messages"):
            return web.Response(body=transcript(["ok"]), content_type="text/event-stream")
        return web.Response(body=openai_stream(["ok"]), content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", record)
    app.router.add_post("/v1/messages", record)
    return app


SENT_HEADERS = ("authorization", "x-api-key", "anthropic-version", "content-type",
                CONVERSATION_HEADER.lower(), CALL_INDEX_HEADER.lower())


def sent(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in SENT_HEADERS}


@pytest.mark.parametrize(("model", "path"), [("openai/x", "/v1"), ("together_ai/meta-llama/x", "/v1"), (CLAUDE, "")])
async def test_the_request_is_the_one_litellm_sends(model: str, path: str) -> None:
    model_settings = {"temperature": 0.3, "top_p": 0.9, "stop": ["\n\nUser:"], "max_tokens": 64, "seed": 7}
    if model == CLAUDE:
        model_settings = {**model_settings, "top_k": 5}
        del model_settings["seed"]
    served = Served()
    runner, port = await serve(capture_app(served))
    base = f"http://127.0.0.1:{port}{path}"
    try:
        fast, _ = await fast_outcome(model, base, settings=model_settings, include_usage=False)
        lite = await litellm_outcome(model, base, **model_settings)
    finally:
        await runner.cleanup()
    assert fast == lite == Outcome("ok", finish="stop")
    (fast_headers, fast_body), (lite_headers, lite_body) = served.requests
    assert fast_body == lite_body
    assert sent(fast_headers) == sent(lite_headers)


# -- keys ----------------------------------------------------------------------------------------


async def test_the_key_comes_from_api_key_env_and_never_shows_in_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAST_TEST_KEY", KEY)

    async def echo_key(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": {"message": f"Incorrect key {request.headers['Authorization']}",
                                            "type": "invalid_request_error"}}, status=401)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", echo_key)
    runner, port = await serve(app)
    try:
        with pytest.raises(ProviderError) as err:
            async for _ in fast_stream(attempt("openai/x", settings={"api_key_env": "FAST_TEST_KEY"}, api_key=None,
                                               api_base=f"http://127.0.0.1:{port}/v1")):
                pass
    finally:
        await runner.cleanup()
    assert err.value.kind == "auth"
    assert KEY not in str(err.value) and "Bearer ***" in err.value.message
    assert err.value.__cause__ is None


async def test_a_missing_key_variable_is_auth_before_any_request() -> None:
    with pytest.raises(ProviderError) as err:   # refused when the call is resolved: nothing to send
        async for _ in fast_stream(attempt("openai/x", settings={"api_key_env": "FAST_TEST_UNSET"}, api_key=None,
                                           api_base="http://127.0.0.1:9/v1")):
            pass
    assert (err.value.kind, err.value.after_first_delta) == ("auth", False)


async def test_a_setting_the_provider_does_not_take_is_bad_request_on_both_paths() -> None:
    served = Served()
    runner, port = await serve(capture_app(served))
    base = f"http://127.0.0.1:{port}"
    try:
        fast, _ = await fast_outcome(CLAUDE, base, settings={"seed": 7}, max_tokens=10)
        lite = await litellm_outcome(CLAUDE, base, seed=7, max_tokens=10)
    finally:
        await runner.cleanup()
    assert fast == lite == Outcome("", error="bad_request", after_first_delta=False)
    assert served.requests == []   # refused before sending, by LiteLLM's parameter mapping


def test_build_request_names_the_anthropic_messages_route() -> None:
    litellm_module()
    request = build_request(attempt(CLAUDE, api_base="http://127.0.0.1:1", max_tokens=10))
    assert request.url == "http://127.0.0.1:1/v1/messages"
    assert request.headers["x-api-key"] == KEY and request.route.wire is Wire.ANTHROPIC_MESSAGES
    assert json.loads(request.body)["system"] == [{"type": "text", "text": "Be brief."}]


@pytest.mark.parametrize(("model", "base"), [("openai/x", "http://127.0.0.1:1/v1"), (CLAUDE, "http://127.0.0.1:1")])
def test_a_calls_tools_reach_the_request_in_the_providers_format(model: str, base: str) -> None:
    # A native round's functions (docs/design.md#native); tests/test_llm_native.py checks whole histories.
    litellm_module()
    tool = {"type": "function", "function": {"name": "lookup", "description": "Look it up.",
                                             "parameters": {"type": "object", "properties": {}}}}
    sent_tools = json.loads(build_request(attempt(model, api_base=base, max_tokens=10, tools=[tool])).body)["tools"]
    assert [t["function"]["name"] if model == "openai/x" else t["name"] for t in sent_tools] == ["lookup"]
    assert "tools" not in json.loads(build_request(attempt(model, api_base=base, max_tokens=10)).body)


# -- Anthropic Messages, from the recorded stream ------------------------------------------------


async def test_the_recorded_anthropic_stream_yields_its_text_finish_and_usage() -> None:
    runner, port = await serve(messages_app(lambda: [RECORDED.read_bytes()]))
    try:
        _, items = await fast_outcome(CLAUDE, f"http://127.0.0.1:{port}", max_tokens=100)
    finally:
        await runner.cleanup()
    assert "".join(i.text for i in items[:-1]) == RECORDED_TEXT
    assert items[-1] == ModelFinished("stop", CLAUDE, Usage(*RECORDED_USAGE))


async def test_litellm_agrees_on_the_recorded_anthropic_stream() -> None:
    runner, port = await serve(messages_app(lambda: [RECORDED.read_bytes()], delay_s=0.001))
    base = f"http://127.0.0.1:{port}"
    try:
        fast, _ = await fast_outcome(CLAUDE, base, max_tokens=100)
        lite = await litellm_outcome(CLAUDE, base, max_tokens=100)
    finally:
        await runner.cleanup()
    assert fast == lite == Outcome(RECORDED_TEXT, finish="stop")


@pytest.mark.parametrize(("error", "kind"), [
    (("api_error", "Internal server error"), "server_error"),
    (("overloaded_error", "Overloaded"), "server_error"),
    (("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"), "server_error"),
    (("invalid_request_error", "prompt is too long: 250000 tokens > 200000 maximum"), "context_window_exceeded"),
])
async def test_an_anthropic_error_event_maps_like_litellm(error: tuple[str, str], kind: str) -> None:
    runner, port = await serve(messages_app(lambda: transcript_events(["ab", "cd"], error=error)))
    base = f"http://127.0.0.1:{port}"
    try:
        fast, _ = await fast_outcome(CLAUDE, base, max_tokens=100)
        lite = await litellm_outcome(CLAUDE, base, max_tokens=100)
    finally:
        await runner.cleanup()
    assert fast == lite == Outcome("abcd", error=kind, after_first_delta=True)


async def test_an_anthropic_stream_cut_before_its_end_is_connection_on_both_paths() -> None:
    runner, port = await serve(messages_app(lambda: transcript_events(["ab", "cd"], end=False)))
    base = f"http://127.0.0.1:{port}"
    try:
        fast, _ = await fast_outcome(CLAUDE, base, max_tokens=100)
        lite = await litellm_outcome(CLAUDE, base, max_tokens=100)
    finally:
        await runner.cleanup()
    assert fast == lite == Outcome("abcd", error="connection", after_first_delta=True)


async def test_closing_an_anthropic_stream_early_closes_the_response() -> None:
    served = Served()
    runner, port = await serve(messages_app(lambda: transcript_events(["x"] * 500), delay_s=0.002, served=served))
    try:
        gen = fast_stream(attempt(CLAUDE, api_base=f"http://127.0.0.1:{port}", max_tokens=1000))
        async with aclosing(gen):
            async for _ in gen:
                break
        await wait_until(lambda: served.aborted > 0)    # the server saw the response closed
    finally:
        await runner.cleanup()
    assert served.aborted == 1


def test_a_pooled_session_whose_loop_ended_unclosed_is_released_by_the_next_loop() -> None:
    # One pooled aiohttp session per event loop; a loop that ends without aclose_sessions() (a
    # test's) must not leave its session held forever nor reported unclosed by aiohttp.
    from actors.llm import transport

    async def take() -> Any:
        return await transport.session()

    first = asyncio.new_event_loop()
    stale = first.run_until_complete(take())
    first.close()
    second = asyncio.new_event_loop()
    try:
        fresh = second.run_until_complete(take())
        assert stale.closed and not fresh.closed and first not in transport._sessions
        second.run_until_complete(transport.aclose_sessions())
    finally:
        second.close()
