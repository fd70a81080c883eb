"""`reactgate mock-llm`: the same scripts over HTTP, for LiteLLM's `openai/` provider (docs/design.md#scripted-model).

The HTTP path must be indistinguishable from the custom provider for `stream_model`: same deltas,
same finish reasons, same error kinds.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from actors.llm.errors import ErrorKind
from actors.llm.mock_server import STATS, MockStats, run_mock_server, start_mock_server
from actors.llm.scripts import (
    CALL_INDEX_HEADER,
    CONVERSATION_HEADER,
    Round,
    Script,
    parse_script,
    register_script,
)
from actors.llm.stream import ModelDelta, ModelFinished, ProviderError, StreamItem, stream_model
from protocol.deltas import ReasoningDelta, ReasoningSignature, RedactedReasoning, ToolCallArgs, ToolCallStart
from tests.fixtures.native_sse import ends_at_the_finish

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "hi"}]

SCRIPT = Script(
    rounds=[
        Round(text="<channel:thinking>Checking the weather.</channel:thinking>", chunk_chars=4),
        Round(deltas=["<channel:", "thinking>", "é°€😀", "", "</channel:thinking>"], finish_reason="length"),
        Round(text="same" * 150, chunk_chars=4),  # 150 identical chunks over HTTP too
        Round(text="", finish_reason="length"),
    ]
)


class Server:
    def __init__(self, port: int, stats: MockStats) -> None:
        self.base = f"http://127.0.0.1:{port}/v1"
        self.stats = stats


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    runner, port = await start_mock_server(SCRIPT)
    try:
        yield Server(port, runner.app[STATS])
    finally:
        await runner.cleanup()


async def outcome(model: str, start: int, api_base: str | None = None, messages: list[dict[str, Any]] = MESSAGES,
                  **kw: Any) -> list[StreamItem] | tuple[str, bool]:
    """The items of one call at call index `start`, or (error kind, after_first_delta)."""
    counter = itertools.count(start)
    items: list[StreamItem] = []
    try:
        async for item in stream_model(
            [model], messages, conversation_id="conv", next_call_index=lambda: next(counter),
            api_base=api_base, api_key="sk-mock" if api_base else None, **kw,
        ):
            items.append(item)
    except ProviderError as exc:
        return exc.kind, exc.after_first_delta
    return items


def texts(items: list[StreamItem] | tuple[str, bool]) -> str:
    assert isinstance(items, list), items
    return "".join(i.text for i in items if isinstance(i, ModelDelta))


def without_model(items: list[StreamItem] | tuple[str, bool]) -> Any:
    if isinstance(items, tuple):
        return items
    return [ModelFinished(i.finish_reason, "") if isinstance(i, ModelFinished) else i for i in items]


@pytest.mark.parametrize("call_index", range(len(SCRIPT.rounds)))
async def test_http_path_streams_the_same_items_as_the_custom_provider(server: Server, call_index: int) -> None:
    scripted = register_script("m-same", SCRIPT)
    direct = await outcome(scripted, call_index)
    http = await outcome("openai/m-same", call_index, server.base)
    assert without_model(http) == without_model(direct)
    assert isinstance(http, list) and isinstance(http[-1], ModelFinished)
    assert http[-1].finish_reason == SCRIPT.rounds[call_index].finish_reason


@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_errors_before_first_delta_map_to_the_same_kinds(kind: ErrorKind) -> None:
    script = Script(rounds=[Round(error=kind)])
    runner, port = await start_mock_server(script)
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1")
        assert runner.app[STATS].requests == 1  # no hidden retries: each would be an uncounted model call
    finally:
        await runner.cleanup()
    direct = await outcome(register_script(f"m-err-{kind.value}", script), 0)
    assert http == direct == (kind.value, False)


@pytest.mark.parametrize(
    "kind", [ErrorKind.RATE_LIMIT, ErrorKind.TIMEOUT, ErrorKind.SERVER_ERROR, ErrorKind.BAD_REQUEST]
)
async def test_errors_mid_stream_map_to_the_same_kinds(kind: ErrorKind) -> None:
    script = Script(rounds=[Round(deltas=["ab", "cd"], error=kind)])
    runner, port = await start_mock_server(script)
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1")
    finally:
        await runner.cleanup()
    direct = await outcome(register_script(f"m-mid-{kind.value}", script), 0)
    assert http == direct == (kind.value, True)


async def test_exhausted_script_maps_to_script_exhausted(server: Server) -> None:
    assert await outcome("openai/x", len(SCRIPT.rounds), server.base) == ("script_exhausted", False)


async def test_read_timeout_maps_to_timeout() -> None:
    runner, port = await start_mock_server(Script(rounds=[Round(deltas=["late"], delay_ms=3000)]))
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1", timeout_s=0.2)
    finally:
        await runner.cleanup()
    assert http == ("timeout", False)


@pytest.mark.parametrize("hang_after", [1, 2])   # mid-stream, and after the last chunk (no finish)
async def test_a_hanging_round_goes_silent_on_both_players_until_the_idle_timeout_cuts_it(hang_after: int) -> None:
    script = Script(rounds=[Round(deltas=["ab", "cd"], hang_after=hang_after)])
    runner, port = await start_mock_server(script)
    try:
        http = await outcome("openai/x", 0, f"http://127.0.0.1:{port}/v1", idle_timeout_s=0.3)
    finally:
        await runner.cleanup()
    direct = await outcome(register_script(f"m-hang-{hang_after}", script), 0, idle_timeout_s=0.3)
    assert http == direct == ("timeout", True)


async def test_closing_early_closes_the_http_stream(server: Server) -> None:
    runner, port = await start_mock_server(Script(rounds=[Round(text="z" * 2000, chunk_chars=1, delay_ms=2)]))
    try:
        stats = runner.app[STATS]
        counter = itertools.count()
        got: list[StreamItem] = []
        gen = stream_model(["openai/x"], MESSAGES, conversation_id="c", next_call_index=lambda: next(counter),
                           api_base=f"http://127.0.0.1:{port}/v1", api_key="sk-mock")
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


# -- raw HTTP ------------------------------------------------------------------------------------


async def sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    body = (await resp.read()).decode()
    assert body.endswith("\n\n")
    return [block.removeprefix("data: ") for block in body.strip().split("\n\n")]


async def test_sse_wire_format(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{server.base}/chat/completions",
                               json={"model": "m", "messages": MESSAGES, "stream": True},
                               headers={CONVERSATION_HEADER: "c", CALL_INDEX_HEADER: "0"})
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == SCRIPT.rounds[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_without_call_index_the_server_counts_per_conversation(server: Server) -> None:
    async def first_text(conversation: str) -> str:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"{server.base}/chat/completions",
                                   json={"model": "m", "messages": MESSAGES, "stream": False},
                                   headers={CONVERSATION_HEADER: conversation})
            return str((await resp.json())["choices"][0]["message"]["content"])

    assert await first_text("a") == SCRIPT.rounds[0].text
    assert await first_text("b") == SCRIPT.rounds[0].text  # its own copy
    assert await first_text("a") == "".join(SCRIPT.rounds[1].chunks)


async def test_models_endpoint(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"{server.base}/models")
        assert resp.status == 200
        assert (await resp.json())["object"] == "list"


def test_run_mock_server_rejects_a_bad_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rounds": [{"txt": "typo"}]}))
    assert run_mock_server(bad, port=0) == 2
    assert "bad.json: rounds.0.txt" in capsys.readouterr().err


async def test_cli_serves_a_script(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rounds": [{"text": "from the cli"}]}))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "mock-llm", "--script", str(script), "--port", "0",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        base = line.split(" at ", 1)[1].split()[0]
        items = await outcome("openai/any", 0, base)
        assert isinstance(items, list) and "".join(i.text for i in items if isinstance(i, ModelDelta)) == "from the cli"
    finally:
        proc.terminate()
        await proc.wait()


async def test_stats_endpoint_reports_what_was_served(server: Server) -> None:
    async with aiohttp.ClientSession() as http:
        await (await http.post(f"{server.base}/chat/completions", json={"model": "m", "messages": MESSAGES},
                               headers={CONVERSATION_HEADER: "c", CALL_INDEX_HEADER: "0"})).read()
        stats = await (await http.get(server.base.removesuffix("/v1") + "/stats")).json()
    # The request offered no functions: conversation "c" is recorded with one empty list of names.
    assert stats == {"requests": 1, "streams_completed": 0, "streams_aborted": 0, "refused": 0, "refusals": [],
                     "offered": {"c": [[]]}}


# -- the Anthropic Messages wire -------------------------------------------------------------------

CLAUDE = "anthropic/claude-mock"


async def anthropic_outcome(model: str, start: int, api_base: str | None, reader: str = "fast",
                            messages: list[dict[str, Any]] = MESSAGES, **kw: Any) -> list[StreamItem] | tuple[str, bool]:
    counter = itertools.count(start)
    items: list[StreamItem] = []
    try:
        async for item in stream_model(
            [model], messages, conversation_id="conv", next_call_index=lambda: next(counter), api_base=api_base,
            api_key="sk-mock" if api_base else None, max_tokens=100, settings={model: {"stream_reader": reader}}, **kw,
        ):
            items.append(item)
    except ProviderError as exc:
        return exc.kind, exc.after_first_delta
    return items


@pytest.mark.parametrize("reader", ["fast", "litellm"])
@pytest.mark.parametrize("call_index", range(len(SCRIPT.rounds)))
async def test_the_anthropic_wire_streams_the_same_text_rounds(server: Server, call_index: int, reader: str) -> None:
    direct = await outcome(register_script("m-same-anthropic", SCRIPT), call_index)
    http = await anthropic_outcome(CLAUDE, call_index, server.base.removesuffix("/v1"), reader)
    assert without_model(http) == without_model(direct)
    assert server.stats.refused == 0


@pytest.mark.parametrize("reader", ["fast", "litellm"])
@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_anthropic_errors_before_first_delta_map_to_the_same_kinds(kind: ErrorKind, reader: str) -> None:
    script = Script(rounds=[Round(error=kind)])
    runner, port = await start_mock_server(script)
    try:
        http = await anthropic_outcome(CLAUDE, 0, f"http://127.0.0.1:{port}", reader)
    finally:
        await runner.cleanup()
    assert http == await outcome(register_script(f"m-aerr-{kind.value}", script), 0) == (kind.value, False)


@pytest.mark.parametrize("reader", ["fast", "litellm"])
@pytest.mark.parametrize("kind", list(ErrorKind))
async def test_anthropic_errors_mid_stream_are_500s_that_only_a_timeout_survives(kind: ErrorKind, reader: str) -> None:
    # An Anthropic `error` event has no status of its own: readers take it as a 500 and keep only
    # what its text says (errors.TEXT_RULES) — a timeout; every other kind reads as server_error.
    runner, port = await start_mock_server(Script(rounds=[Round(deltas=["ab", "cd"], error=kind)]))
    try:
        http = await anthropic_outcome(CLAUDE, 0, f"http://127.0.0.1:{port}", reader)
    finally:
        await runner.cleanup()
    assert http == ("timeout" if kind is ErrorKind.TIMEOUT else "server_error", True)


# -- native rounds on both wires (docs/design.md#native) ----------------------------------------------

NATIVE = Round.model_validate({
    "native": [{"reasoning": "Rain?", "signature": "sig-1"}, {"redacted": "opaque"}, {"text": "Let me check."},
               {"call": {"name": "demo_weather", "arguments": {"city": "Paris"}, "id": "call_1"}, "split": [5, 12]},
               {"call": {"name": "demo_clock", "id": "call_2"}}],
    "chunk_chars": 4, "usage": {"prompt_tokens": 7, "completion_tokens": 9}})


async def post(base: str, path: str, body: dict[str, Any], call_index: int = 0) -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{base}{path}", json=body, headers={CONVERSATION_HEADER: "c", CALL_INDEX_HEADER: str(call_index)})
        await resp.read()
        return resp


# What each Anthropic event carries, summed up.
EVENT_SUMMARY: dict[str, Callable[[dict[str, Any]], Any]] = {
    "message_start": lambda d: d["message"]["usage"], "ping": lambda d: None,
    "content_block_start": lambda d: (d["index"], d["content_block"]),
    "content_block_delta": lambda d: (d["index"], d["delta"]), "content_block_stop": lambda d: d["index"],
    "message_delta": lambda d: (d["delta"]["stop_reason"], d["usage"]), "message_stop": lambda d: None,
    "error": lambda d: d["error"],
}


def anthropic_events(body: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for block in body.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        name, data = name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, EVENT_SUMMARY[name](data)))
    return out


@pytest.fixture
async def native_server() -> AsyncIterator[Server]:
    runner, port = await start_mock_server(Script(rounds=[NATIVE], loop=True))
    try:
        yield Server(port, runner.app[STATS])
    finally:
        await runner.cleanup()


async def test_the_openai_wire_streams_a_native_round_as_openai_does(native_server: Server) -> None:
    resp = await post(native_server.base, "/chat/completions", {
        "model": "m", "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}})
    events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"] for c in chunks[:-2]] == [
        {"role": "assistant", "reasoning_content": "Rain"}, {"reasoning_content": "?"},   # no field for signatures
        {"content": "Let "}, {"content": "me c"}, {"content": "heck"}, {"content": "."},
        {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "demo_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"cit'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'y": "Pa'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": 'ris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "demo_clock", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
    ]
    assert chunks[-2]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 9,
                                                                   "total_tokens": 16}


async def test_the_anthropic_wire_streams_a_native_round_as_anthropic_does(native_server: Server) -> None:
    resp = await post(native_server.base.removesuffix("/v1"), "/v1/messages",
                      {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 100})
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    assert anthropic_events((await resp.read()).decode()) == [
        ("message_start", {"input_tokens": 7, "output_tokens": 1}), ("ping", None),
        ("content_block_start", (0, {"type": "thinking", "thinking": ""})),
        ("content_block_delta", (0, {"type": "thinking_delta", "thinking": "Rain"})),
        ("content_block_delta", (0, {"type": "thinking_delta", "thinking": "?"})),
        ("content_block_delta", (0, {"type": "signature_delta", "signature": "sig-1"})),
        ("content_block_stop", 0),
        ("content_block_start", (1, {"type": "redacted_thinking", "data": "opaque"})), ("content_block_stop", 1),
        ("content_block_start", (2, {"type": "text", "text": ""})),
        *(("content_block_delta", (2, {"type": "text_delta", "text": t})) for t in ("Let ", "me c", "heck", ".")),
        ("content_block_stop", 2),
        ("content_block_start", (3, {"type": "tool_use", "id": "call_1", "name": "demo_weather", "input": {}})),
        *(("content_block_delta", (3, {"type": "input_json_delta", "partial_json": j}))
          for j in ('{"cit', 'y": "Pa', 'ris"}')),
        ("content_block_stop", 3),
        ("content_block_start", (4, {"type": "tool_use", "id": "call_2", "name": "demo_clock", "input": {}})),
        ("content_block_delta", (4, {"type": "input_json_delta", "partial_json": "{}"})), ("content_block_stop", 4),
        ("message_delta", ("tool_use", {"output_tokens": 9})), ("message_stop", None),
    ]


@pytest.mark.parametrize(("finish", "stop_reason"), [("stop", "end_turn"), ("length", "max_tokens")])
async def test_an_anthropic_answer_ends_with_its_stop_reason(finish: str, stop_reason: str) -> None:
    runner, port = await start_mock_server(Script(rounds=[Round(native=[{"text": "Hi."}], finish_reason=finish)]))
    try:
        resp = await post(f"http://127.0.0.1:{port}", "/v1/messages", {"model": "m", "messages": MESSAGES, "stream": True})
        events = anthropic_events((await resp.read()).decode())
    finally:
        await runner.cleanup()
    assert events[-2][0] == "message_delta" and events[-2][1][0] == stop_reason


async def test_a_native_round_failing_mid_call_leaves_the_anthropic_block_open() -> None:
    failing = Round.model_validate({"native": [{"call": {"name": "a", "arguments": '{"x": 1}'}, "split": [3]}],
                                    "error": "server_error"})
    runner, port = await start_mock_server(Script(rounds=[failing]))
    try:
        resp = await post(f"http://127.0.0.1:{port}", "/v1/messages", {"model": "m", "messages": MESSAGES, "stream": True})
        events = anthropic_events((await resp.read()).decode())
    finally:
        await runner.cleanup()
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                            "content_block_delta", "error"]
    assert events[-1][1] == {"type": "api_error", "message": "Internal server error (scripted server_error)"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_non_streamed_answer_holds_the_whole_native_round(native_server: Server, path: str) -> None:
    resp = await post(native_server.base.removesuffix("/v1"), path, {"model": "m", "messages": MESSAGES})
    answer = await resp.json()
    if path == "/v1/messages":
        assert [b["type"] for b in answer["content"]] == ["thinking", "redacted_thinking", "text", "tool_use", "tool_use"]
        assert answer["content"][0] == {"type": "thinking", "thinking": "Rain?", "signature": "sig-1"}
        assert answer["content"][3]["input"] == {"city": "Paris"} and answer["stop_reason"] == "tool_use"
    else:
        message = answer["choices"][0]["message"]
        assert (message["content"], message["reasoning_content"]) == ("Let me check.", "Rain?")
        assert [c["function"] for c in message["tool_calls"]] == [
            {"name": "demo_weather", "arguments": '{"city": "Paris"}'}, {"name": "demo_clock", "arguments": "{}"}]
        assert answer["choices"][0]["finish_reason"] == "tool_calls"


def litellm_view(chunks: list[Any]) -> list[tuple[Any, ...]]:
    """What LiteLLM's own parser made of a stream: its content, reasoning, signatures, redacted
    blocks and call fragments, in order (not a reader: the test's view of LiteLLM's chunks)."""
    out: list[tuple[Any, ...]] = []
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if getattr(delta, "reasoning_content", None):
            out.append(("reasoning", delta.reasoning_content))
        for block in getattr(delta, "thinking_blocks", None) or ():
            if block.get("signature"):
                out.append(("signature", block["signature"]))
            elif block["type"] == "redacted_thinking":
                out.append(("redacted", block["data"]))
        if delta.content:
            out.append(("content", delta.content))
        for call in delta.tool_calls or ():
            out.append(("call", call.index, call.id, call.function.name, call.function.arguments or ""))
        if chunk.choices[0].finish_reason:
            out.append(("finish", chunk.choices[0].finish_reason))
    return out


def script_view(round_: Round, *, signatures: bool) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for d in round_.stream:
        if isinstance(d, ReasoningDelta):
            out.append(("reasoning", d.text))
        elif isinstance(d, ReasoningSignature) and signatures:
            out.append(("signature", d.signature))
        elif isinstance(d, RedactedReasoning) and signatures:
            out.append(("redacted", d.data))
        elif isinstance(d, ModelDelta):
            out.append(("content", d.text))
        elif isinstance(d, ToolCallStart):
            out.append(("call", d.index, d.call_id, d.name, ""))
        elif isinstance(d, ToolCallArgs):
            out.append(("call", d.index, None, None, d.fragment))
    return [*out, ("finish", round_.finish_reason)]


@pytest.mark.parametrize(("model", "suffix", "signatures"), [("openai/m", "/v1", False), (CLAUDE, "", True)])
async def test_litellms_own_parsers_read_the_native_round_the_script_says(
        native_server: Server, model: str, suffix: str, signatures: bool) -> None:
    from actors.llm.lite import litellm_module

    stream = await litellm_module().acompletion(
        model=model, messages=MESSAGES, stream=True, api_base=native_server.base.removesuffix("/v1") + suffix,
        api_key="sk-mock", max_tokens=100, extra_headers={CONVERSATION_HEADER: "c", CALL_INDEX_HEADER: "0"})
    chunks = [chunk async for chunk in stream]
    assert litellm_view(chunks) == script_view(NATIVE, signatures=signatures)
    assert native_server.stats.refused == 0


@pytest.mark.parametrize("reader", ["fast", "litellm"])
@pytest.mark.parametrize(("model", "suffix"), [("openai/m", "/v1"), (CLAUDE, "")])
async def test_both_wires_stream_the_native_round_the_direct_player_streams(
        native_server: Server, model: str, suffix: str, reader: str) -> None:
    direct = await outcome(register_script("m-native", Script(rounds=[NATIVE])), 0)
    http = await anthropic_outcome(model, 0, native_server.base.removesuffix("/v1") + suffix, reader)
    if model.startswith("openai/"):   # the OpenAI wire has no field for signatures and redacted blocks
        direct = [d for d in direct if not isinstance(d, ReasoningSignature | RedactedReasoning)]  # type: ignore[union-attr]
    # Where the wire has no call end (OpenAI's, and LiteLLM's wrapper for both), calls end at the finish.
    assert ends_at_the_finish(without_model(http)) == ends_at_the_finish(without_model(direct))


# -- one mock, a behaviour per conversation; continuations --------------------------------------------


async def test_by_message_serves_each_conversation_its_sub_script_over_http() -> None:
    script = parse_script({"by_message": {"weather": {"rounds": [{"text": "rain"}]},
                                          "budget": {"rounds": [{"native": [{"text": "ask first"}]}]}}})
    runner, port = await start_mock_server(script)
    base = f"http://127.0.0.1:{port}"
    try:
        got = {}
        for first in ("weather in Paris?", "what budget?"):
            asked = [{"role": "user", "content": first}]
            got[first] = (texts(await outcome("openai/x", 0, base + "/v1", messages=asked)),
                          texts(await anthropic_outcome(CLAUDE, 0, base, messages=asked)))
        refused = await outcome("openai/x", 0, base + "/v1", messages=[{"role": "user", "content": "hello"}])
    finally:
        await runner.cleanup()
    assert got == {"weather in Paris?": ("rain", "rain"), "what budget?": ("ask first", "ask first")}
    assert refused == ("bad_request", False)   # no sub-script and no default


@pytest.mark.parametrize(("model", "suffix", "prefill"), [(CLAUDE, "", True), ("openai/x", "/v1", False)])
async def test_a_native_answer_cut_short_is_continued_over_http(model: str, suffix: str, prefill: bool) -> None:
    answer = "It rains in Paris, 12 °C. Take an umbrella."
    script = Script(rounds=[Round(native=[{"reasoning": "ok"}, {"text": answer}])], loop=True, continues=True)
    runner, port = await start_mock_server(script)
    try:
        asked = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "It rains in "}]
        if not prefill:
            asked.append({"role": "user", "content": "[continue] Continue exactly where it stopped."})
        items = await anthropic_outcome(model, 1, f"http://127.0.0.1:{port}{suffix}", messages=asked)
    finally:
        await runner.cleanup()
    # A prefill goes without its trailing whitespace (LiteLLM strips it, as Anthropic requires); the
    # model's continuation starts with it.
    assert texts(items) == answer[len("It rains in"):] if prefill else answer[len("It rains in "):]
