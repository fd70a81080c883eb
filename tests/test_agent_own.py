"""Your own agent (docs/design.md#your-own-agent): tools written as functions, instructions, the
worked example, and model settings — through the same loader `serve` uses.

The tool module is real Python written into the test's temp dir and imported from there; the model
endpoint is a real OpenAI-compatible server on loopback (`reactgate mock-llm`'s app) that records
what it received.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from actors.agent import load_agent
from actors.catalog import Safety, Trait
from actors.context import system_prompt
from actors.hosting.backend import UserMessage
from actors.identity import Owner
from actors.llm.mock_server import make_app
from actors.llm.scripts import parse_script
from actors.profile import ProfileError
from actors.tools.registry import ToolContext
from gateway.app import agent_setup, local_backend
from gateway.settings import Settings
from protocol.events import Event
from tests.roundkit import action, call, thinking

OWNER = Owner(tenant="acme", sub="alice")

TOOLS_MODULE = '''
import threading
from actors.catalog import Trait
from actors.tools import tool, ToolContext, Tool
from actors.tools.registry import Params


@tool(trait="exploration", safety="safe", description="Look up an order by id.")
async def lookup_order(order_id: str, ctx: ToolContext) -> dict:
    return {"order_id": order_id, "status": "shipped", "conversation": ctx.conversation_id}


@tool(trait="exploitation", safety="write")
def cancel_order(order_id: str, reason: str = "customer asked") -> dict:
    """Cancel an order.

    Runs in a worker thread: a plain def may block."""
    return {"cancelled": order_id, "reason": reason, "thread": threading.current_thread().name}


@tool(trait="neutral")
def order_count() -> int:
    return 3


def not_a_tool(order_id: str) -> dict:
    return {}


class NoteParams(Params):
    text: str


async def _note(params: NoteParams, ctx: ToolContext) -> dict:
    return {"noted": params.text}


note = Tool("any.id", NoteParams, _note, Trait.NEUTRAL, description="Keep a note.")  # the profile's id wins
'''


def write_agent(root: Path, profile: str, module: str = TOOLS_MODULE, name: str = "acme_tools") -> Path:
    (root / f"{name}.py").write_text(textwrap.dedent(module))
    path = root / "acme.toml"
    path.write_text(textwrap.dedent(profile))
    return path


PROFILE = '''
name = "acme"
model = "scripted/acme"
instructions = "You are Acme's order assistant. Be brief."

[[tools]]
id = "acme.lookup_order"
impl = "acme_tools:lookup_order"

[[tools]]
id = "acme.cancel_order"
impl = "acme_tools:cancel_order"

[[tools]]
id = "acme.order_count"
impl = "acme_tools:order_count"

[[tools]]
id = "acme.note"
impl = "acme_tools:note"
'''


# -- tools from functions ---------------------------------------------------------------------------


async def test_decorated_functions_become_tools_with_params_from_their_annotations(tmp_path: Path) -> None:
    agent = await load_agent(write_agent(tmp_path, PROFILE))
    catalog = agent.registry.catalog()
    lookup, cancel = catalog.get("acme.lookup_order"), catalog.get("acme.cancel_order")
    assert lookup is not None and cancel is not None
    assert (lookup.trait, lookup.safety, lookup.description) == (Trait.EXPLORATION, Safety.SAFE, "Look up an order by id.")
    assert (cancel.trait, cancel.safety) == (Trait.EXPLOITATION, Safety.WRITE)
    assert cancel.description == "Cancel an order."                 # the docstring's first paragraph
    assert lookup.params_schema["required"] == ["order_id"]           # the ToolContext parameter is not a param
    assert "ctx" not in lookup.params_schema["properties"]
    assert agent.registry.validate_params("acme.lookup_order", {"order_id": "A1", "extra": 1})[1] == [
        "extra: unknown parameter"]
    assert agent.registry.validate_params("acme.lookup_order", {"order_id": 7})[1] == [
        "order_id: Input should be a valid string"]


async def test_a_function_tool_runs_async_on_the_loop_and_sync_in_a_thread(tmp_path: Path) -> None:
    agent = await load_agent(write_agent(tmp_path, PROFILE))
    ctx = ToolContext(conversation_id="c1", turn_id="t1", call_id="k1")

    async def run(tool_id: str, params: dict[str, Any]) -> dict[str, Any]:
        tool = agent.registry.get(tool_id)
        model, violations = agent.registry.validate_params(tool_id, params)
        assert tool is not None and model is not None and violations == []
        return await tool.handler(model, ctx)

    assert await run("acme.lookup_order", {"order_id": "A1"}) == {
        "order_id": "A1", "status": "shipped", "conversation": "c1"}
    cancelled = await run("acme.cancel_order", {"order_id": "A1"})
    assert cancelled["reason"] == "customer asked" and cancelled["thread"] != "MainThread"
    assert await run("acme.order_count", {}) == {"result": 3}        # any JSON value becomes an object
    assert await run("acme.note", {"text": "hi"}) == {"noted": "hi"}   # a Tool object, under the profile's id


async def test_the_registry_pickles_as_its_sources_and_rebuilds_the_same_tools(tmp_path: Path) -> None:
    agent = await load_agent(write_agent(tmp_path, PROFILE))
    data = pickle.dumps(agent.registry)
    assert b"shipped" not in data and len(data) < 2000                # sources, not code or tools
    rebuilt = pickle.loads(data)
    assert [d.tool_id for d in rebuilt.catalog()] == [d.tool_id for d in agent.registry.catalog()]
    tool = rebuilt.get("acme.lookup_order")
    model, _ = rebuilt.validate_params("acme.lookup_order", {"order_id": "B2"})
    assert (await tool.handler(model, ToolContext("c", "t", "k")))["order_id"] == "B2"


@pytest.mark.parametrize(("impl", "reason"), [
    ("acme_missing:lookup", "cannot import module 'acme_missing'"),
    ("acme_tools:nothing_here", "module 'acme_tools' has no attribute 'nothing_here'"),
    ("acme_tools:not_a_tool", "is neither a function decorated with @tool nor a Tool"),
    ("acme_tools", "is not of the form 'module:attribute'"),
])
async def test_a_bad_impl_is_a_start_up_error_naming_the_profile_and_the_field(
    tmp_path: Path, impl: str, reason: str
) -> None:
    path = write_agent(tmp_path, PROFILE.replace('"acme_tools:cancel_order"', json.dumps(impl)))
    with pytest.raises(ProfileError) as err:
        await load_agent(path)
    assert str(err.value).startswith("acme.toml: tools[1].impl: ") and reason in str(err.value)


async def test_an_id_without_impl_must_be_a_built_in_tool(tmp_path: Path) -> None:
    path = write_agent(tmp_path, PROFILE + '\n[[tools]]\nid = "acme.refund"\n')
    with pytest.raises(ProfileError, match=r"acme.toml: tools\[4\].id: unknown tool 'acme.refund'"):
        await load_agent(path)


# -- the prompt ---------------------------------------------------------------------------------------


async def test_the_prompt_puts_the_instructions_first_and_its_example_uses_the_agents_own_tools(tmp_path: Path) -> None:
    agent = await load_agent(write_agent(tmp_path, PROFILE))
    decls = list(agent.registry.catalog().restricted_to(agent.profile.tool_ids))
    prompt = system_prompt(agent="acme", state="default", mode="agent", tools=decls, max_actions=2,
                           exploration_cap=7, allow_no_tool=False, ledger="", instructions=agent.profile.instructions)
    assert prompt.startswith("You are Acme's order assistant. Be brief.\n")
    assert "demo." not in prompt and "Paris" not in prompt
    assert '"tool_id": "acme.lookup_order", "params": {"order_id": "…"}' in prompt   # the exploration tool


async def test_instructions_file_is_read_relative_to_the_profile(tmp_path: Path) -> None:
    (tmp_path / "acme.md").write_text("Answer in French.\n")
    path = write_agent(tmp_path, PROFILE.replace(
        'instructions = "You are Acme\'s order assistant. Be brief."', 'instructions_file = "acme.md"'))
    assert (await load_agent(path)).profile.instructions == "Answer in French.\n"


# -- model settings, through a recording OpenAI-compatible endpoint ----------------------------------


SECRET = "sk-acme-0123456789-do-not-leak"


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """`reactgate mock-llm`'s app on loopback, recording each request's body and Authorization."""
    script = parse_script({"rounds": [
        {"text": thinking("Looking it up.") + action(call("acme.lookup_order", order_id="A1"))},
        {"text": thinking("Found it.") + action({"action": "complete", "final_answer": "Order A1 has shipped."})},
    ]})
    seen: list[dict[str, Any]] = []

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            seen.append({"body": await request.json(), "authorization": request.headers.get("Authorization"),
                         "agent": request.headers.get("User-Agent", "")})
        return await handler(request)

    app = make_app(script)
    app.middlewares.append(record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", seen
    await runner.cleanup()


async def test_model_settings_reach_the_endpoint_and_the_key_reaches_nothing_else(
    tmp_path: Path, endpoint: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base, seen = endpoint
    monkeypatch.setenv("ACME_LLM_KEY", SECRET)
    path = write_agent(tmp_path, PROFILE.replace('model = "scripted/acme"', 'model = "openai/acme-small"') + f'''
[model_settings]
api_base = "{base}"
api_key_env = "ACME_LLM_KEY"
temperature = 0.2
max_tokens = 1024
''')
    store_path = tmp_path / "store.sqlite3"
    settings = Settings(agent=path, backend="local", store=f"sqlite:///{store_path}")
    caplog.set_level(logging.DEBUG)
    setup = await asyncio.to_thread(agent_setup, settings)   # serve's own start-up (runs its own loop)
    backend = local_backend(settings, setup)
    await backend.start()
    try:
        cid = (await backend.open(OWNER, None, None, None)).conversation_id
        events: list[Event] = []
        assert await backend.command(OWNER, cid, UserMessage("m1", "Where is order A1?")) == "accepted"
        async for batch in backend.subscribe(OWNER, cid, 0):
            events.extend(batch)
            if any(e.event == "turn.completed" for e in batch):
                break
    finally:
        await backend.stop()

    [done] = [e for e in events if e.event == "turn.completed"]
    assert (done.data.reason, done.data.final_answer) == ("complete", "Order A1 has shipped.")
    [result] = [e for e in events if e.event == "tool.result"]
    assert result.data.result["status"] == "shipped"
    assert len(seen) == 2
    for request in seen:
        system = request["body"]["messages"][0]
        assert system["role"] == "system" and system["content"].startswith("You are Acme's order assistant.")
        assert "demo." not in system["content"]
        assert request["body"]["temperature"] == 0.2 and request["body"]["max_tokens"] == 1024
        assert request["body"]["model"] == "acme-small"
        assert request["authorization"] == f"Bearer {SECRET}"
    # the key is nowhere but in the request: not in events, the store, or any log record
    assert SECRET not in json.dumps([e.to_builtins() if hasattr(e, "to_builtins") else repr(e) for e in events])
    assert SECRET.encode() not in store_path.read_bytes()
    assert SECRET not in caplog.text


async def test_a_key_variable_that_is_not_set_fails_the_call_naming_the_variable(
    tmp_path: Path, endpoint: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from actors.llm.stream import ProviderError, stream_model

    base, seen = endpoint
    monkeypatch.delenv("ACME_UNSET_KEY", raising=False)
    with pytest.raises(ProviderError) as err:
        async for _ in stream_model(["openai/acme-small"], [{"role": "user", "content": "hi"}],
                                    conversation_id="c", next_call_index=lambda: 0,
                                    settings={"openai/acme-small": {"api_base": base, "api_key_env": "ACME_UNSET_KEY"}}):
            pass
    assert err.value.kind == "auth" and "ACME_UNSET_KEY" in err.value.message
    assert seen == []                                               # nothing was sent without a key


@pytest.mark.parametrize(("setting", "reason"), [
    ('api_key = "sk-in-the-file"', "name its environment variable in `api_key_env`"),
    ("stream = false", "the runtime always streams"),
    ('api_key_env = "not a name"', "model_settings.api_key_env"),
])
async def test_model_settings_refuse_what_would_break_a_guarantee_or_leak_a_key(
    tmp_path: Path, setting: str, reason: str
) -> None:
    path = write_agent(tmp_path, PROFILE + f"\n[model_settings]\n{setting}\n")
    with pytest.raises(ProfileError) as err:
        await load_agent(path)
    assert str(err.value).startswith("acme.toml: model_settings") and reason in str(err.value)
    assert "sk-in-the-file" not in str(err.value)


def test_each_model_gets_its_own_settings_and_a_fallback_without_any_gets_none(tmp_path: Path) -> None:
    from actors.profile import load_profile

    path = write_agent(tmp_path, PROFILE.replace('model = "scripted/acme"', '''model = "openai/small"
fallbacks = ["openai/large", "openai/backup"]''') + '''
[model_settings]
api_base = "http://127.0.0.1:8000/v1"
temperature = 0.2

[fallback_settings."openai/large"]
api_key_env = "LARGE_KEY"
top_p = 0.9
''')
    profile = load_profile(path, known_tools=None)
    assert profile.settings_for("openai/small") == {"api_base": "http://127.0.0.1:8000/v1", "temperature": 0.2}
    assert profile.settings_for("openai/large") == {"api_key_env": "LARGE_KEY", "top_p": 0.9}
    assert profile.settings_for("openai/backup") == {}


def test_settings_for_a_model_that_is_not_a_fallback_are_refused(tmp_path: Path) -> None:
    from actors.profile import load_profile

    path = write_agent(tmp_path, PROFILE + '\n[fallback_settings."openai/other"]\ntemperature = 1\n')
    with pytest.raises(ProfileError, match=r'fallback_settings.openai/other: \'openai/other\' is not one of the fallbacks'):
        load_profile(path, known_tools=None)


@pytest.mark.parametrize("reader", ["fast", "litellm"])
async def test_stream_model_reads_openai_sse_itself_unless_the_profile_says_litellm(
    endpoint: tuple[str, list[dict[str, Any]]], reader: str
) -> None:
    from actors.llm.stream import ModelDelta, ModelFinished, stream_model

    base, seen = endpoint
    settings = {"openai/acme-small": {"api_base": base, "stream_reader": reader}}
    items = [item async for item in stream_model(
        ["openai/acme-small"], [{"role": "user", "content": "hi"}], conversation_id="c", next_call_index=lambda: 0,
        api_key="sk-loopback", settings=settings)]
    text = "".join(i.text for i in items if isinstance(i, ModelDelta))
    assert text.startswith("<channel:thinking>Looking it up.") and isinstance(items[-1], ModelFinished)
    [request] = seen
    assert "stream_reader" not in request["body"]                 # our setting never reaches the provider
    assert ("aiohttp" in request["agent"]) is (reader == "fast")   # who read the stream
