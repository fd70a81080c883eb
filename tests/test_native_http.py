"""Native function calling over HTTP, through LiteLLM's providers, as a team runs it
(docs/design.md#native): `openai/…` and `anthropic/…` models with `api_base` at `reactgate mock-llm`,
which speaks each provider's SSE and refuses what each provider refuses with its own 400 — so every
request the gateway sends is checked as the real ones check it. On the local and the ray backend.

Each behaviour the channel protocol is tested for, re-expressed natively, is a sub-script of one
mock, chosen by the conversation's first message (docs/design.md#scripted-model): the happy call,
an illegal first finish, a preamble kept out of the answer, incompatible parallel calls, three calls,
invalid arguments, ask mode, a state transition, the exploration budget, ask_user, reasoning, and a
provider error mid-answer continued.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from actors.gates import EXPLORATION_MARKER, STOP_EXPLORING
from actors.profile import BUILTIN_DIR, AgentProfile, load_profile
from actors.tools.demo import demo_registry
from gateway.app import AgentSetup, local_backend
from gateway.server import GatewayServer
from gateway.settings import Settings
from tests.e2e import check_log, local_ray, store_url
from tests.kit import TIMEOUT, Client, client

pytestmark = pytest.mark.asyncio(loop_scope="module")
REPO = Path(__file__).resolve().parent.parent
KEY_ENV = "MOCK_LLM_KEY"
PREAMBLE = "Let me check."                      # shorter than the hold: told apart from an answer
WEATHER = "It is raining in Paris, 12 °C. Take an umbrella."
HALF = "It is raining in Paris all day long, and "  # longer than the hold: it reached the user
WHOLE = HALF + "the wind is from the west, 12 °C."
QUESTION = f"{EXPLORATION_MARKER} I have searched a lot. Go on?"


def call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """A call whose arguments arrive in fragments, split where they are long enough to split."""
    body = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"call": {"name": name, "arguments": arguments}, "split": [p for p in (3, 8) if p < len(body)]}


def native(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"native": list(parts), "chunk_chars": 5, **fields}


def answer(text: str) -> dict[str, Any]:
    return native({"text": text})


BEHAVIOURS: dict[str, list[dict[str, Any]]] = {
    "weather": [native({"text": PREAMBLE}, call("demo_weather", {"city": "Paris"})), answer(WEATHER)],
    "illegal": [answer("Sunny, surely."), native(call("demo_weather", {"city": "Paris"})), answer(WEATHER)],
    "pair": [native(call("demo_search", {"query": "q3"}), call("demo_render", {"source": "q3", "format": "pdf"})),
             answer("Found q3.")],
    "three": [native(call("demo_clock", {}), call("demo_clock", {}), call("demo_clock", {})), answer("Noon.")],
    "invalid": [native(call("demo_weather", {"town": "Paris"})), native(call("demo_weather", '{"city": "Par')),
                native(call("demo_weather", {"city": "Paris"})), answer(WEATHER)],
    "asknote": [native(call("demo_focus_project", {"name": "groceries"})), native(call("demo_write_note", {"text": "milk"})),
                answer("I cannot write notes in ask mode.")],
    "focus": [native(call("demo_focus_project", {"name": "groceries"})), native(call("demo_write_note", {"text": "milk"})),
              answer("Noted.")],
    "budget": [native(call("demo_search", {"query": "a"}), call("demo_search", {"query": "b"})),
               native(call("demo_clock", {})),
               native(call("react_ask_user", {"question": QUESTION, "options": ["Continue exploring", STOP_EXPLORING]})),
               native(call("demo_search", {"query": "c"})), answer("Stopped exploring.")],
    "ask": [native(call("react_ask_user", {"question": "Which city?", "options": ["Paris", "Rome"]})),
            native(call("demo_weather", {"city": "Rome"})), answer("Rome is sunny.")],
    # Its own city: the mock knows the messages it signed by their calls, and expects their thinking back.
    "reasoning": [native({"reasoning": "The user wants Lyon.", "signature": "c2lnLTE="}, call("demo_weather", {"city": "Lyon"})),
                  native({"reasoning": "Rain, then.", "signature": "c2lnLTI="}, {"text": WEATHER})],
    "cut": [native(call("demo_weather", {"city": "Paris"})), native({"text": HALF}, error="server_error"), answer(WHOLE)],
}
SCRIPT = {"by_message": {name: {"rounds": rounds, "continues": True} for name, rounds in BEHAVIOURS.items()}}
WIRES = {"openai": ("openai/mock-native", "/v1"), "anthropic": ("anthropic/claude-mock-native", "")}


def profiles(port: int) -> list[AgentProfile]:
    """The native demo twin, once per wire, pointed at the mock; exploration is budgeted at 1 call."""
    base = load_profile(BUILTIN_DIR / "demo_native.toml", known_tools=demo_registry())
    out = []
    for wire, (model, suffix) in WIRES.items():
        policies = base.policies.model_copy(update={"exploration_soft_cap": 1, "preamble_hold_chars": 30,
                                                    "flush_interval_ms": 5})
        out.append(base.model_copy(update={
            "name": wire, "model": model, "policies": policies,
            "model_settings": base.model_settings.model_copy(update={"api_base": f"http://127.0.0.1:{port}{suffix}",
                                                                     "api_key_env": KEY_ENV}),
        }))
    return out


# -- the mock and the gateways -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """`reactgate mock-llm` serving both wires, as its own process."""
    root = tmp_path_factory.mktemp("native-mock")
    (root / "script.json").write_text(json.dumps(SCRIPT))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "mock-llm", "--script", str(root / "script.json"),
                             "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert f":{port}" in line, line + proc.stdout.read().decode()
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
        return dict(json.load(response))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray({KEY_ENV: "sk-mock"}) as ray:
        yield ray


@pytest_asyncio.fixture(scope="module", loop_scope="module",
                        params=["local", pytest.param("ray", marks=pytest.mark.ray)])
async def gateway(request: pytest.FixtureRequest, mock: int,
                  tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """One gateway per backend for the module: its hosts start once (each test opens its own
    conversations, so they share nothing else)."""
    os.environ[KEY_ENV] = "sk-mock"   # where the model is called (docs/design.md#model-settings)
    openai, anthropic = profiles(mock)
    store = tmp_path_factory.mktemp(f"native-{request.param}") / "s.sqlite3"
    settings = Settings(host="127.0.0.1", port=0, backend=request.param, store=store_url(store))
    setup = AgentSetup(openai, demo_registry(), None, others=(anthropic,))
    if request.param == "local":
        backend = local_backend(settings, setup)
    else:
        request.getfixturevalue("ray_cluster")
        from actors.ray.backend import RayBackend
        from gateway.app import ray_config

        backend = RayBackend(ray_config(settings, setup), default_agent="openai")
    server = GatewayServer(settings, backend)
    host, port = await server.start()
    try:
        yield f"ws://{host}:{port}/ws"
    finally:
        await server.drain()


@contextlib.asynccontextmanager
async def conversation(url: str, wire: str, mode: str = "agent") -> AsyncIterator[tuple[Client, str]]:
    async with client(url) as c:
        cid = await c.open(agent=wire, mode=mode)
        await c.subscribe(cid)
        yield c, cid


async def turn(c: Client, cid: str, text: str, answers: tuple[str, ...] = ()) -> dict[str, Any]:
    """Send `text`, answer each ask_user in order, and return the turn's turn.completed data."""
    await c.say(cid, text)
    pending = list(answers)
    asked: set[int] = set()

    def next_step() -> tuple[str, dict[str, Any]] | None:
        for e in c.events.get(cid, []):
            if e["event"] == "ask_user" and e["seq"] not in asked and pending:
                asked.add(e["seq"])
                return "ask", e["data"]
            if e["event"] == "turn.completed":
                return "done", e["data"]
        return None

    while True:
        step, data = await c.until(next_step, TIMEOUT * 3)
        if step == "done":
            return data
        await c.send(type="answer", conversation_id=cid, ask_id=data["ask_id"], answer=pending.pop(0))


def named(c: Client, cid: str, name: str) -> list[dict[str, Any]]:
    return [e["data"] for e in c.events[cid] if e["event"] == name]


def text(c: Client, cid: str, name: str) -> str:
    return "".join(d["text"] for d in named(c, cid, name))


def codes(c: Client, cid: str) -> list[list[str]]:
    return [[n["code"] for n in r["notices"]] for r in named(c, cid, "round.completed")]


def whole(c: Client, cid: str, done: dict[str, Any]) -> None:
    """What every turn must be: seqs without gap, the final answer exactly what streamed, one each
    call and result (check_log)."""
    check_log(c.events[cid])
    assert done["final_answer"] == text(c, cid, "answer.delta")


@pytest.fixture
def refusals(mock: int) -> Iterator[None]:
    """Every request a test sent is one the provider takes: the mock refused none of them."""
    before = stats(mock)["refused"]
    yield
    after = stats(mock)
    assert after["refused"] == before, after["refusals"][-5:]


WIRE_NAMES = sorted(WIRES)


# -- the behaviours ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_a_call_then_its_answer_and_the_preamble_never_in_it(gateway: str, wire: str, mock: int,
                                                                   refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "weather in Paris?")
    whole(c, cid, done)
    assert (done["reason"], done["final_answer"]) == ("complete", WEATHER)
    assert PREAMBLE not in text(c, cid, "answer.delta") and PREAMBLE in text(c, cid, "thinking.delta")
    [called] = named(c, cid, "tool.call")
    assert (called["tool_id"], called["params"]) == ("demo.weather", {"city": "Paris"})
    offered = stats(mock)["offered"][cid]
    assert "demo_weather" in offered[0] and "react_ask_user" in offered[0]


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_finishing_first_is_illegal_and_shows_nothing(gateway: str, wire: str, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "illegal: is it sunny?")
    whole(c, cid, done)
    assert "Sunny" not in text(c, cid, "answer.delta") and done["final_answer"] == WEATHER
    assert codes(c, cid)[0] == ["finish.illegal"]
    assert [t["kind"] for t in named(c, cid, "trace")].count("illegal_finish") == 1


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_incompatible_parallel_calls_run_only_the_first(gateway: str, wire: str, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "pair: find q3 and render it")
    whole(c, cid, done)
    assert [r["tool_id"] for r in named(c, cid, "tool.result")] == ["demo.search"]
    assert codes(c, cid)[0] == ["multi_action.incompatible_traits"]


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_a_third_call_is_past_the_limit(gateway: str, wire: str, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "three: what time is it?")
    whole(c, cid, done)
    assert len(named(c, cid, "tool.result")) == 2
    assert codes(c, cid)[0] == ["protocol_violation.too_many_actions"]


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_invalid_arguments_never_run(gateway: str, wire: str, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "invalid: the forecast?")
    whole(c, cid, done)
    assert codes(c, cid)[:2] == [["protocol_violation.tool_call_invalid"], ["protocol_violation.tool_call_invalid"]]
    assert [r["call_id"] for r in named(c, cid, "tool.result")] == ["t1.3.0"]


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_ask_mode_leaves_the_write_tool_out_and_denies_a_call_to_it(gateway: str, wire: str, mock: int,
                                                                          refusals: None) -> None:
    async with conversation(gateway, wire, mode="ask") as (c, cid):
        done = await turn(c, cid, "asknote: note milk")
    whole(c, cid, done)
    assert codes(c, cid)[1] == ["ASK_MODE_DENIED"]
    assert all("demo_write_note" not in names for names in stats(mock)["offered"][cid])


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_a_state_transition_changes_the_functions_offered(gateway: str, wire: str, mock: int,
                                                                refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "focus: note milk")
    whole(c, cid, done)
    offered = stats(mock)["offered"][cid]
    assert "demo_write_note" not in offered[0] and "demo_write_note" in offered[1]
    assert [r["ok"] for r in named(c, cid, "tool.result")] == [True, True]


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_the_exploration_budget_asks_and_stops(gateway: str, wire: str, mock: int, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "budget: search everything", answers=(STOP_EXPLORING,))
    whole(c, cid, done)
    results = [r for r in named(c, cid, "tool.result") if r["tool_id"] == "demo.search"]
    assert [r.get("error") for r in results] == [None, "EXPLORATION_BUDGET_REACHED"]
    assert codes(c, cid)[1] == ["exploration_budget.confirmation_required"]
    assert codes(c, cid)[3] == ["tool_unavailable"]
    assert "demo_search" not in stats(mock)["offered"][cid][3]


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_ask_user_is_a_function_answered_by_the_user(gateway: str, wire: str, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "ask: the forecast?", answers=("Rome",))
    whole(c, cid, done)
    [asked] = named(c, cid, "ask_user")
    assert (asked["question"], asked["options"]) == ("Which city?", ["Paris", "Rome"])
    assert named(c, cid, "tool.call")[1]["params"] == {"city": "Rome"}


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_reasoning_is_thinking_and_its_signatures_go_back(gateway: str, wire: str, refusals: None) -> None:
    # The Anthropic mock refuses a tool-use history without its signed thinking: `refusals` checks it.
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "reasoning: the forecast?")
    whole(c, cid, done)
    assert text(c, cid, "thinking.delta").startswith("The user wants Lyon.")
    assert "c2lnLTE=" not in json.dumps(c.events[cid])


@pytest.mark.parametrize("wire", WIRE_NAMES)
async def test_a_provider_error_mid_answer_is_continued(gateway: str, wire: str, refusals: None) -> None:
    async with conversation(gateway, wire) as (c, cid):
        done = await turn(c, cid, "cut: the forecast?")
    whole(c, cid, done)
    assert (done["reason"], done["final_answer"]) == ("complete", WHOLE)
    assert "partial" not in done

