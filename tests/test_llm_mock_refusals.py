"""`reactgate mock-llm` refuses what the real providers refuse, with their own 400 (docs/design.md#scripted-model).

Each rule on a minimal request body (`mock_refusals.py`), then over HTTP: the status and the error
body each provider sends, the count a test reads to assert reactgate sent nothing a provider would
refuse, and a native history rendered by reactgate itself passing on both wires.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from actors.llm.mock_refusals import ANTHROPIC_CHECKS, OPENAI_CHECKS, Issued, Refusal, first_refusal
from actors.llm.mock_server import STATS, MockStats, start_mock_server
from actors.llm.scripts import CONVERSATION_HEADER, Script, parse_script
from actors.llm.stream import ModelDelta, ProviderError, StreamItem, stream_model

USER = {"role": "user", "content": "weather in paris?"}
WEATHER_TOOL = {"type": "function", "function": {"name": "demo_weather", "description": "d",
                                                  "parameters": {"type": "object", "properties": {}}}}


def openai(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> Refusal | None:
    body: dict[str, Any] = {"model": "m", "messages": [USER, *messages]}
    if tools is not None:
        body["tools"] = tools
    return first_refusal(OPENAI_CHECKS, body, Issued())


def called(*ids: str, name: str = "demo_weather") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": name, "arguments": "{}"}} for i in ids]}


def answered(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "{}"}


# -- OpenAI ------------------------------------------------------------------------------------------


def test_openai_accepts_a_history_where_every_call_is_answered() -> None:
    assert openai(called("a", "b"), answered("a"), answered("b"), {"role": "user", "content": "[notice] …"},
                  tools=[WEATHER_TOOL]) is None


def test_openai_refuses_a_call_not_followed_by_a_tool_message_for_each_id() -> None:
    refusal = openai(called("a", "b"), answered("a"), {"role": "user", "content": "and?"})
    assert refusal == Refusal(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: b",
        param="messages.[3].role", rule="tool_calls_unanswered")


def test_openai_refuses_a_call_answered_after_another_message() -> None:
    refusal = openai(called("a"), {"role": "user", "content": "wait"}, answered("a"))
    assert refusal is not None and refusal.rule == "tool_calls_unanswered"


@pytest.mark.parametrize("messages", [
    [answered("a")],                                   # no call before it
    [called("a"), answered("a"), answered("zzz")],     # an id the call did not make
])
def test_openai_refuses_a_tool_message_that_answers_no_call(messages: list[dict[str, Any]]) -> None:
    refusal = openai(*messages)
    assert refusal is not None and refusal.rule == "tool_message_unasked"
    assert refusal.message == ("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                               "message with 'tool_calls'.")
    assert refusal.param == f"messages.[{len(messages)}].role"


@pytest.mark.parametrize(("name", "code"), [("demo.weather", "invalid_value"), ("", "invalid_value"),
                                            ("x" * 65, "string_above_max_length")])
def test_openai_refuses_a_function_name_outside_the_pattern(name: str, code: str) -> None:
    tool = {"type": "function", "function": {"name": name, "parameters": {}}}
    refusal = openai(tools=[WEATHER_TOOL, tool])
    assert refusal is not None and (refusal.rule, refusal.param, refusal.code) == (
        "function_name", "tools[1].function.name", code)
    assert refusal.message.startswith("Invalid 'tools[1].function.name': string ")


def test_openai_refuses_a_function_name_outside_the_pattern_in_the_history() -> None:
    refusal = openai(called("a", name="demo.weather"), answered("a"))
    assert refusal is not None and (refusal.rule, refusal.param) == ("function_name", "messages[1].tool_calls[0].function.name")
    assert "'^[a-zA-Z0-9_-]{1,64}$'" in refusal.message


# -- Anthropic ---------------------------------------------------------------------------------------

SIGNED = parse_script({"rounds": [
    {"native": [{"reasoning": "Rain?", "signature": "sig-1"}, {"redacted": "opaque"}, {"text": "Let me check."},
                {"call": {"name": "demo_weather", "arguments": {"city": "Paris"}, "id": "toolu_1"}}]},
    {"native": [{"text": "It rains."}]},
]})
ISSUED = Issued.of(SIGNED)
THOUGHT = {"type": "thinking", "thinking": "Rain?", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "opaque"}
TOOLS = [{"name": "demo_weather", "input_schema": {"type": "object"}}]


def tool_use(call_id: str = "t1_0_0", **city: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "demo_weather", "input": city or {"city": "Paris"}}


def tool_result(call_id: str = "t1_0_0") -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "{}"}]}


def anthropic(*messages: dict[str, Any], tools: list[dict[str, Any]] | None = TOOLS) -> Refusal | None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]}, *messages]}
    if tools is not None:
        body["tools"] = tools
    return first_refusal(ANTHROPIC_CHECKS, body, ISSUED)


def said(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def test_anthropic_accepts_a_tool_use_history_that_sends_its_thinking_back_unchanged() -> None:
    assert anthropic(said(THOUGHT, REDACTED, {"type": "text", "text": "Let me check."}, tool_use()),
                     tool_result(), said({"type": "text", "text": "It rains"})) is None


@pytest.mark.parametrize("messages", [
    [said({"type": "text", "text": "a"}), said({"type": "text", "text": "b"})],
    [tool_result(), {"role": "user", "content": "more"}],
])
def test_anthropic_refuses_roles_that_do_not_alternate(messages: list[dict[str, Any]]) -> None:
    refusal = anthropic(*messages, tools=None)
    assert refusal is not None and refusal.rule == "roles"
    assert refusal.message.startswith('messages: roles must alternate between "user" and "assistant", but found multiple')


def test_anthropic_refuses_a_first_message_that_is_not_the_users() -> None:
    body = {"model": "m", "messages": [said({"type": "text", "text": "hi"})]}
    assert first_refusal(ANTHROPIC_CHECKS, body, ISSUED) == Refusal('messages: first message must use the "user" role',
                                                                    rule="roles")


def test_anthropic_refuses_tool_blocks_without_tools() -> None:
    refusal = anthropic(said(THOUGHT, REDACTED, tool_use()), tool_result(), tools=None)
    assert refusal == Refusal("Requests which include `tool_use` or `tool_result` blocks must define tools.",
                              rule="tools_missing")


def test_anthropic_refuses_a_tool_use_not_answered_in_the_next_user_message() -> None:
    refusal = anthropic(said(THOUGHT, REDACTED, tool_use(), tool_use("t1_0_1")), tool_result(),
                        said({"type": "text", "text": "It rains"}))
    assert refusal == Refusal(
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: t1_0_1. Each "
        "`tool_use` block must have a corresponding `tool_result` block in the next message.",
        rule="tool_use_unanswered")


def test_anthropic_refuses_a_tool_result_that_answers_no_tool_use() -> None:
    refusal = anthropic(said(THOUGHT, REDACTED, tool_use()), tool_result("t9"))
    assert refusal is not None and refusal.rule == "tool_use_unanswered"   # the call's own answer is missing first
    refusal = anthropic(said({"type": "text", "text": "hm"}), tool_result("t9"))
    assert refusal == Refusal(
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: t9. Each `tool_result` block "
        "must have a corresponding `tool_use` block in the previous message.", rule="tool_result_unasked")


@pytest.mark.parametrize("content", ["It rains ", [{"type": "text", "text": "It rains\n"}]])
def test_anthropic_refuses_a_prefill_that_ends_in_whitespace(content: Any) -> None:
    assert anthropic({"role": "assistant", "content": content}) == Refusal(
        "messages: final assistant content cannot end with trailing whitespace", rule="prefill_whitespace")
    assert anthropic({"role": "assistant", "content": "It rains"}) is None


def test_anthropic_refuses_a_tool_use_turn_the_mock_streamed_with_thinking_sent_back_without_it() -> None:
    refusal = anthropic(said({"type": "text", "text": "Let me check."}, tool_use()), tool_result())
    assert refusal is not None and refusal.rule == "thinking_blocks"
    assert refusal.message.startswith("messages.1.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                                      "found `text`. When `thinking` is enabled, a final `assistant` message must "
                                      "start with a thinking block")


@pytest.mark.parametrize(("blocks", "message"), [
    ([{**THOUGHT, "thinking": "Sun?"}, REDACTED], "messages.1.content.0: Invalid `signature` in `thinking` block"),
    ([{**THOUGHT, "signature": "forged"}, REDACTED], "messages.1.content.0: Invalid `signature` in `thinking` block"),
    ([{k: v for k, v in THOUGHT.items() if k != "signature"}, REDACTED],
     "messages.1.content.0: Invalid `signature` in `thinking` block"),
    ([THOUGHT, {**REDACTED, "data": "changed"}], "messages.1.content.1: Invalid `data` in `redacted_thinking` block"),
    ([THOUGHT], "messages.1.content: the thinking blocks of an assistant message that used tools must be sent back "
                "as they came, in order, none left out"),
])
def test_anthropic_refuses_thinking_blocks_not_sent_back_unchanged(blocks: list[dict[str, Any]], message: str) -> None:
    assert anthropic(said(*blocks, tool_use()), tool_result()) == Refusal(message, rule="thinking_blocks")


def test_anthropic_asks_no_thinking_of_calls_the_mock_never_made_after_signed_thinking() -> None:
    assert anthropic(said({"type": "text", "text": "hm"}, tool_use(city="Rome")), tool_result()) is None


def test_anthropic_refuses_a_function_name_outside_the_pattern() -> None:
    refusal = anthropic(tools=[*TOOLS, {"name": "demo.weather", "input_schema": {}}])
    assert refusal == Refusal("tools.1.custom.name: String should match pattern '^[a-zA-Z0-9_-]{1,64}$'",
                              rule="function_name")


# -- over HTTP ---------------------------------------------------------------------------------------


class Mock:
    def __init__(self, port: int, stats: MockStats) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.stats = stats


@pytest.fixture
async def mock() -> AsyncIterator[Mock]:
    runner, port = await start_mock_server(Script(rounds=[*SIGNED.rounds], loop=True))
    try:
        yield Mock(port, runner.app[STATS])
    finally:
        await runner.cleanup()


async def test_openai_refusals_are_openais_400_and_are_counted(mock: Mock) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{mock.base}/v1/chat/completions", json={"model": "m", "messages": [USER, called("a")]})
        body = await resp.json()
        stats = await (await http.get(f"{mock.base}/stats")).json()
    assert resp.status == 400
    assert body == {"error": {
        "message": "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                   "'tool_call_id'. The following tool_call_ids did not have response messages: a",
        "type": "invalid_request_error", "param": "messages.[2].role", "code": None}}
    assert (stats["refused"], stats["refusals"], stats["streams_completed"]) == (1, ["openai.tool_calls_unanswered"], 0)


async def test_anthropic_refusals_are_anthropics_400_and_are_counted(mock: Mock) -> None:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(f"{mock.base}/v1/messages", json={
            "model": "m", "max_tokens": 10, "stream": True,
            "messages": [USER, {"role": "assistant", "content": "It rains "}]})
        body = await resp.json()
    assert resp.status == 400
    assert body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages: final assistant content cannot end with trailing whitespace"}}
    assert (mock.stats.refused, mock.stats.refusals) == (1, ["anthropic.prefill_whitespace"])


async def attempt(model: str, base: str, messages: list[dict[str, Any]], call_index: int, reader: str,
                  tools: list[dict[str, Any]]) -> list[StreamItem] | tuple[str, bool, str]:
    counter = itertools.count(call_index)
    items: list[StreamItem] = []
    try:
        async for item in stream_model([model], messages, conversation_id="c", next_call_index=lambda: next(counter),
                                       api_base=base, api_key="sk-mock", max_tokens=100, tools=tools,
                                       settings={model: {"stream_reader": reader}}):
            items.append(item)
    except ProviderError as exc:
        return exc.kind, exc.after_first_delta, exc.message
    return items


def reactgate_history(*, with_thinking: bool) -> list[dict[str, Any]]:
    """Round 0 of SIGNED as reactgate sends it back (actors/native.py, docs/design.md#native): the
    preamble, the signed thinking as it came, the call under reactgate's own id, its observation."""
    from actors.context import Message
    from actors.native import render_history
    from protocol.timeline import ModelMessageBlock, NativeCall, ToolResultBlock, UserMessageBlock

    reasoning = [dict(b) for b in SIGNED.rounds[0].thinking_blocks()] if with_thinking else []
    blocks = [UserMessageBlock("t1", "m1", "weather in paris?"),
              ModelMessageBlock("t1", 0, content="Let me check.", calls=[NativeCall(0, "demo.weather", {"city": "Paris"})],
                                reasoning=reasoning),
              ToolResultBlock("t1", "t1.0.0", "demo.weather", True, {"city": "Paris", "condition": "rain"})]
    messages: list[Message] = [{"role": "system", "content": "Be brief."}]
    for unit in render_history(blocks, "t1"):
        messages += unit.messages
    return messages


@pytest.mark.parametrize("reader", ["fast", "litellm"])
@pytest.mark.parametrize(("model", "suffix"), [("openai/m", "/v1"), ("anthropic/claude-mock", "")])
async def test_a_native_history_reactgate_renders_is_refused_by_neither_wire(
        mock: Mock, model: str, suffix: str, reader: str) -> None:
    items = await attempt(model, mock.base + suffix, reactgate_history(with_thinking=True), 1, reader, [WEATHER_TOOL])
    assert mock.stats.refusals == []
    assert isinstance(items, list) and "".join(i.text for i in items if isinstance(i, ModelDelta)) == "It rains."


@pytest.mark.parametrize("reader", ["fast", "litellm"])
async def test_thinking_left_out_of_a_tool_use_history_is_refused_as_a_bad_request(mock: Mock, reader: str) -> None:
    got = await attempt("anthropic/claude-mock", mock.base, reactgate_history(with_thinking=False), 1, reader,
                        [WEATHER_TOOL])
    assert got[:2] == ("bad_request", False) and "Expected `thinking` or `redacted_thinking`" in str(got[2])
    assert mock.stats.refusals == ["anthropic.thinking_blocks"]


async def test_a_refused_request_plays_no_round(mock: Mock) -> None:
    async with aiohttp.ClientSession() as http:
        headers = {CONVERSATION_HEADER: "c"}   # no index: the mock counts the conversation's calls itself
        refused = await http.post(f"{mock.base}/v1/chat/completions", headers=headers,
                                  json={"model": "m", "messages": [USER, called("a")]})
        played = await http.post(f"{mock.base}/v1/chat/completions", headers=headers,
                                 json={"model": "m", "messages": [USER]})
        answer = json.loads(await played.read())
    assert (refused.status, played.status) == (400, 200)
    assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "demo_weather"   # round 0, not 1
