"""`reactgate agent check` (docs/design.md#agent-check): a good profile prints its tools per state;
each broken one names the profile and the field and exits non-zero. Real tool module, real MCP
server (the mcp SDK's MCPServer over stdio), both written into the test's temp dir."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.llm.errors import ErrorKind
from actors.llm.mock_server import start_mock_server
from actors.llm.scripts import Round, Script
from gateway.cli import main

TOOLS = '''
from actors.tools import tool, ToolContext


@tool(trait="exploration", description="Look up an order by id.")
async def lookup_order(order_id: str, ctx: ToolContext) -> dict:
    return {"order_id": order_id}


@tool(trait="exploitation", safety="write", transitions_state=True)
def cancel_order(order_id: str) -> dict:
    """Cancel an order."""
    return {"cancelled": order_id, "state": "verified"}


not_a_tool = 42
'''

SERVER = '''
from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def read_note(key: str) -> str:
    """Read a note."""
    return ""


@server.tool()
def delete_note(key: str) -> dict:
    """Delete a note."""
    return {}


server.run()
'''

PROFILE = f'''
name = "acme"
model = "openai/acme-small"
states = ["default", "verified"]

[[tools]]
id = "acme.lookup_order"
impl = "check_tools:lookup_order"

[[tools]]
id = "acme.cancel_order"
impl = "check_tools:cancel_order"
states = ["verified"]

[[tools]]
id = "demo.clock"

[[mcp_servers]]
name = "notes"
command = [{json.dumps(sys.executable)}, "notes_server.py"]
startup_timeout_s = 20
[mcp_servers.tools]
read_note = {{ trait = "exploration" }}
delete_note = {{ trait = "exploitation", safety = "write" }}
'''


def agent(tmp_path: Path, profile: str = PROFILE) -> Path:
    (tmp_path / "check_tools.py").write_text(TOOLS)
    (tmp_path / "notes_server.py").write_text(SERVER)
    path = tmp_path / "acme.toml"
    path.write_text(textwrap.dedent(profile))
    return path


def test_a_good_profile_prints_each_states_tools_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "check", str(agent(tmp_path))]) == 0
    out = capsys.readouterr().out
    default, verified = out.split("state 'verified'")
    assert "acme.lookup_order" in default and "acme.cancel_order" not in default
    assert "acme.cancel_order" in verified
    for text in ("python check_tools:lookup_order", "mcp notes", "built-in", "notes.delete_note", "hidden", "offered"):
        assert text in out


def test_json_lists_every_tool_with_its_source_traits_and_availability(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["agent", "check", str(agent(tmp_path)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    tools = {t["id"]: t for t in report["tools"]}
    assert report["ok"] is True and set(tools) == {
        "acme.lookup_order", "acme.cancel_order", "demo.clock", "notes.read_note", "notes.delete_note"}
    assert tools["acme.cancel_order"] == {
        "id": "acme.cancel_order", "source": "python check_tools:cancel_order", "trait": "exploitation",
        "safety": "write", "uses_code": False, "transitions_state": True, "states": ["verified"],
        "hidden_in_ask_mode": True}
    assert tools["notes.read_note"]["source"] == "mcp notes" and tools["notes.read_note"]["states"] == ["default", "verified"]
    assert tools["demo.clock"]["hidden_in_ask_mode"] is False


@pytest.mark.parametrize(("old", "new", "field", "reason"), [
    ('impl = "check_tools:lookup_order"', 'impl = "acme_missing:lookup_order"',
     "tools[0].impl", "cannot import module 'acme_missing'"),
    ('impl = "check_tools:lookup_order"', 'impl = "check_tools:not_a_tool"',
     "tools[0].impl", "is neither a function decorated with @tool nor a Tool"),
    ('delete_note = {', 'drop_note = {',
     "mcp_servers.notes.tools.drop_note", "the server has no tool 'drop_note'"),
    ('startup_timeout_s = 20', 'startup_timeout_s = 1\ncommand = ["sleep", "60"]',
     "mcp_servers.notes", "did not answer within 1 s"),
])
def test_a_broken_profile_names_the_profile_and_the_field_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, field: str, reason: str
) -> None:
    text = PROFILE.replace(old, new)
    if "sleep" in new:  # the server that never starts replaces the real one's command
        text = text.replace(f'command = [{json.dumps(sys.executable)}, "notes_server.py"]\n', "")
    assert main(["agent", "check", str(agent(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert f"acme.toml: {field}: " in err and reason in err, err


# -- warnings: what would make every call fail, or go out unchecked (exit 0) ------------------------

MODEL_PROFILE = '''
name = "acme"
model = "MODEL"
fallbacks = ["openai/acme-large"]

[model_settings]
api_base = "API_BASE"
api_key_env = "REACTGATE_TEST_ACME_KEY"
SETTING

[fallback_settings."openai/acme-large"]
api_base = "API_BASE"
api_key_env = "REACTGATE_TEST_ACME_UNSET_KEY"
'''


def model_profile(tmp_path: Path, model: str = "openai/acme-small", api_base: str = "http://127.0.0.1:9/v1",
                  setting: str = "temperature = 0.2") -> Path:
    path = tmp_path / "acme.toml"
    path.write_text(MODEL_PROFILE.replace("MODEL", model).replace("API_BASE", api_base).replace("SETTING", setting))
    return path


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACTGATE_TEST_ACME_KEY", "sk-test-not-a-real-key")
    monkeypatch.delenv("REACTGATE_TEST_ACME_UNSET_KEY", raising=False)


UNSET_KEY_WARNING = (
    'acme.toml: fallback_settings."openai/acme-large".api_key_env: the variable REACTGATE_TEST_ACME_UNSET_KEY is not '
    "set here: every call of 'openai/acme-large' fails with auth in a process that does not have it")


def test_an_unset_key_variable_is_a_warning_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "check", str(model_profile(tmp_path))]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == [f"{tmp_path / 'acme.toml'}: 1 warning(s)", f"  {UNSET_KEY_WARNING}"]


def test_a_model_string_without_a_provider_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "check", str(model_profile(tmp_path, model="acme-small"))]) == 0
    assert ("acme.toml: model: no provider for model 'acme-small': a LiteLLM model string starts with its provider, "
            "e.g. 'openai/acme-small' for an OpenAI-compatible endpoint") in capsys.readouterr().err


def test_a_setting_the_provider_does_not_take_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "check", str(model_profile(tmp_path, setting="temprature = 0.2\nmax_tokens = 64"))]) == 0
    err = capsys.readouterr().err
    assert ("acme.toml: model_settings.temprature: LiteLLM knows no parameter 'temprature' for provider 'openai' "
            "(model 'openai/acme-small'): it would be sent to the provider unchecked") in err
    assert "max_tokens" not in err and "api_base" not in err and "api_key_env: the variable REACTGATE_TEST_ACME_KEY" not in err


def test_warnings_are_in_the_json_and_the_report_stays_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "check", str(model_profile(tmp_path, model="acme-small")), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and "probes" not in report
    assert [w.split(": ")[1] for w in report["warnings"]] == ["model", 'fallback_settings."openai/acme-large".api_key_env']
    assert main(["agent", "check", str(agent(tmp_path)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


# -- --probe: one real call per model, against a loopback mock (never a real provider) --------------


@contextlib.contextmanager
def mock_llm(*rounds: Round) -> Iterator[str]:
    """`reactgate mock-llm` playing `rounds` on a loopback port, on a loop of its own in a thread (agent
    check runs its own); its api_base."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[tuple[Any, int]] = concurrent.futures.Future()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        runner, port = loop.run_until_complete(start_mock_server(Script(rounds=list(rounds))))
        started.set_result((runner, port))
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, name="mock-llm", daemon=True)
    thread.start()
    _, port = started.result(timeout=20)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(20)


def test_probe_calls_each_model_and_says_what_came_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with mock_llm(Round(text="Hello from the loopback mock, played from a script.")) as base:
        assert main(["agent", "check", str(model_profile(tmp_path, api_base=base)), "--probe"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "probe openai/acme-small: ok, it answered 'Hello from the loopback mock, played fro'",
        "probe openai/acme-large: failed: auth: the variable REACTGATE_TEST_ACME_UNSET_KEY (api_key_env) is not set "
        "where this model is called",
    ]


def test_probe_reports_the_providers_error_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with mock_llm(Round(error=ErrorKind.RATE_LIMIT)) as base:
        assert main(["agent", "check", str(model_profile(tmp_path, api_base=base)), "--probe", "--json"]) == 1
    probes = json.loads(capsys.readouterr().out)["probes"]
    assert probes[0] == {"model": "openai/acme-small", "ok": False, "kind": "rate_limit",
                         "message": "scripted rate_limit (HTTP 429)"}


def test_probe_of_a_model_without_a_provider_sends_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with mock_llm(Round(text="never asked")) as base:
        assert main(["agent", "check", str(model_profile(tmp_path, model="acme-small", api_base=base)), "--probe"]) == 1
    assert ("probe acme-small: failed: bad_request: no provider for model 'acme-small': a LiteLLM model string starts "
            "with its provider, e.g. 'openai/acme-small' for an OpenAI-compatible endpoint") in capsys.readouterr().out
# -- several profiles (docs/design.md#several-agents) -------------------------------------------------


def second(tmp_path: Path, text: str = 'name = "second"\nmodel = "scripted/demo"\n[[tools]]\nid = "demo.clock"\n') -> Path:
    path = tmp_path / "second.toml"
    path.write_text(text)
    return path


def test_several_profiles_are_each_checked_and_one_broken_one_fails_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = agent(tmp_path)
    broken = second(tmp_path, 'name = "second"\nmodel = "scripted/demo"\n[policies]\nmax_iterations = 0\n')
    assert main(["agent", "check", str(good), str(broken)]) == 2
    captured = capsys.readouterr()
    assert "acme.lookup_order" in captured.out                 # the good one's tables are still shown
    assert "second.toml: policies.max_iterations" in captured.err


def test_several_profiles_in_json_are_a_list_of_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "check", str(agent(tmp_path)), str(second(tmp_path)), "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["agent"], r["ok"]) for r in reports] == [("acme", True), ("second", True)]
    assert [t["id"] for t in reports[1]["tools"]] == ["demo.clock"]


def test_a_directory_is_its_profiles_and_two_of_one_name_fail_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    agent(tmp_path)
    twin = second(tmp_path, 'name = "acme"\nmodel = "scripted/demo"\n')
    assert main(["agent", "check", str(tmp_path), "--json"]) == 2
    *each, together = json.loads(capsys.readouterr().out)
    assert [r["ok"] for r in each] == [True, True]
    assert together == {"ok": False, "profile": "together", "problems": [
        f"{tmp_path / 'acme.toml'} and {twin} both define the agent 'acme': agent names must be unique"]}


def test_the_decision_protocol_in_force_is_named_with_each_tools_function(capsys: pytest.CaptureFixture[str]) -> None:
    from actors.profile import BUILTIN_DIR

    assert main(["agent", "check", str(BUILTIN_DIR / "demo_native.toml")]) == 0
    out = capsys.readouterr().out
    assert "decision protocol: native (the model's function calling)" in out
    assert "demo_weather" in out          # the function the tool is offered as
    assert main(["agent", "check", "--json", str(BUILTIN_DIR / "demo.toml")]) == 0
    assert json.loads(capsys.readouterr().out)["decision"] == "channels"
