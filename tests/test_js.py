"""The JavaScript side, under Node's own test runner: tests/js/*.test.mjs against a real gateway.

Each Node test file runs with `run_node_tests(path, env)`: `node --test` in a subprocess, while this
process serves a real gateway on loopback — on the local and the Ray backend, anonymous and with
auth (the `js_gateway` fixture) — and tells the Node tests where it is through the environment
(tests/js/harness.mjs: REACTGATE_URL, REACTGATE_TOKEN, REACTGATE_AUTH_SECRET, REACTGATE_BACKEND).
Node's exit code decides; its output is shown on failure.

`./dev test` installs the Node packages (`npm ci`, package-lock.json) before pytest. Without Node
(≥ 20) or without node_modules these tests skip with the reason, except under CI (CI=true), where
that is a failure. Node 20 has the global WebSocket behind --experimental-websocket (Node 22 by
default): `node_command` adds the flag where it is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from actors.profile import AgentProfile, demo_profile
from actors.tools.demo import demo_registry
from tests.e2e import (
    REPO,
    SECRET,
    LocalServer,
    RayHosting,
    local_server,
    ray_hosting,
    ray_server,
    script,
    slow_answer_script,
    token,
)
from tests.mcpkit import big_profile, face_profile
from tests.roundkit import action, call, complete, text_round, thinking

JS_TESTS = REPO / "tests" / "js"
NODE_MODULES = REPO / "node_modules"
NODE_MIN_MAJOR = 20
NODE_TIMEOUT_S = 240.0
# The demo agent on a scripted model (no key): weather, then a 400-character answer in 4-character
# chunks 10 ms apart, so that a test can cut a connection mid-answer (tests/test_e2e_resume.py).
SCRIPT = slow_answer_script(answer_chars=400, delay_ms=10)
# Two more agents beside it, for the frontends' human-in-the-loop tests (tests/js/aisdk.test.mjs,
# tests/js/agui.test.mjs): "ask" asks which city; "confirm" focuses a project (notes are written only
# there) and writes a note, which waits for the user's approval.
ASK = script(
    text_round(thinking("I need the city."), action(call("react.ask_user", question="Which city?",
                                                          options=["Paris", "Oslo"]))),
    text_round(thinking("Answering."), action(complete("It rains in Paris, 12 °C."))),
    loop=True,
)
CONFIRM = script(
    text_round(thinking("Focusing."), action(call("demo.focus_project", name="weather"))),
    text_round(thinking("Noting it."), action(call("demo.write_note", text="It rains in Paris."))),
    text_round(thinking("Done."), action(complete("Noted: it rains in Paris."))),
    loop=True,
)


def _agent(name: str, **update: Any) -> AgentProfile:
    return demo_profile(known_tools=demo_registry()).model_copy(update={"name": name, **update})


# And the MCP face's agents (tests/mcpkit.py; tests/js/mcp.test.mjs): "face", and "big" with a compact catalog.
OTHERS = {"ask": (_agent("ask"), ASK), "confirm": (_agent("confirm", confirm_writes=True), CONFIRM),
          "face": (face_profile(), SCRIPT), "big": (big_profile(), SCRIPT)}


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (under CI a missing Node is a failure)")
    pytest.skip(reason)


def node_command() -> list[str]:
    """`node` with the flags this Node needs (or skip/fail, see the module docstring)."""
    node = shutil.which("node")
    if node is None:
        _missing("the JavaScript tests need Node.js ≥ 20 (`node` is not on PATH)")
        raise AssertionError("unreachable")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=False, timeout=30).stdout
    found = re.match(r"v(\d+)\.", version)
    major = int(found.group(1)) if found else 0
    if major < NODE_MIN_MAJOR:
        _missing(f"the JavaScript tests need Node.js ≥ {NODE_MIN_MAJOR}, found {version.strip() or 'none'}")
    if not NODE_MODULES.is_dir():
        _missing(f"{NODE_MODULES} is missing: run `npm ci` (./dev test does)")
    return [node, "--experimental-websocket"] if major < 22 else [node]


def node_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment minus any REACTGATE_* of the developer's shell, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACTGATE_")}
    return {**env, "NO_COLOR": "1", **extra}


async def run_node_tests(path: Path, env: Mapping[str, str], timeout: float = NODE_TIMEOUT_S) -> None:
    """`node --test path` with `env` added, without blocking the event loop (the gateway under test
    may run in it); fails with Node's output unless it exits 0."""
    command = [*node_command(), "--test", "--test-reporter=spec", str(path)]
    proc = await asyncio.create_subprocess_exec(
        *command, cwd=REPO, env=node_env(env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        output, _ = await proc.communicate()
        pytest.fail(f"{' '.join(command)} ran over {timeout:.0f} s:\n{output.decode(errors='replace')}")
    text = output.decode(errors="replace")
    print(text)  # shown with -s or -rP, and on failure
    assert proc.returncode == 0, f"{' '.join(command)} exited with {proc.returncode}:\n{text}"


# -- the gateway the Node tests talk to ----------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    scripts = {"demo": SCRIPT, **{name: data for name, (_, data) in OTHERS.items()}}
    profiles = {name: profile for name, (profile, _) in OTHERS.items()}
    with ray_hosting(tmp_path_factory.mktemp("ray"), scripts, profiles=profiles) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["anonymous", "auth"])
async def js_gateway(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    """A gateway on loopback playing SCRIPT, and the environment that tells the Node tests about it."""
    node_command()  # skip (or fail) before starting anything
    auth = request.param == "auth"
    settings = {"auth_secret": SECRET} if auth else {}
    server: contextlib.AbstractAsyncContextManager[LocalServer]
    if backend == "ray":
        server = ray_server(request.getfixturevalue("ray_cluster"), **settings)
    else:
        server = local_server(tmp_path / "s.sqlite3", SCRIPT, others=tuple(OTHERS.values()), **settings)
    async with server as s:
        env = {"REACTGATE_URL": s.url, "REACTGATE_BACKEND": backend}
        if auth:
            env |= {"REACTGATE_TOKEN": token(), "REACTGATE_AUTH_SECRET": SECRET}
        yield env


# -- the tests ----------------------------------------------------------------------------------


def test_the_js_modules_parse() -> None:
    """`node --check` on the browser modules and the Node tests: a syntax error fails here, fast."""
    node = node_command()
    modules = sorted((REPO / "gateway" / "static").glob("*.js")) + sorted(JS_TESTS.glob("*.mjs"))
    assert modules
    for module in modules:
        result = subprocess.run([*node, "--check", str(module)], capture_output=True, text=True, check=False,
                                cwd=REPO, timeout=60)
        assert result.returncode == 0, f"{module}:\n{result.stderr}"


async def test_the_js_client_rules_on_scripted_frames() -> None:
    """tests/js/rules.test.mjs: reactgate.js's rules against a fake WebSocket (no server): gaps,
    repeats, re-sends after a reconnect, the error reactions, close 4001."""
    await run_node_tests(JS_TESTS / "rules.test.mjs", {})


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_js_client_against_a_real_gateway(js_gateway: dict[str, str]) -> None:
    """tests/js/client.test.mjs: reactgate.js streams, resumes a cut connection with every seq once,
    re-sends a pending command without duplicating it, and takes a fresh token after a 4001."""
    await run_node_tests(JS_TESTS / "client.test.mjs", js_gateway)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_ai_sdk_client_against_a_real_gateway(js_gateway: dict[str, str]) -> None:
    """tests/js/aisdk.test.mjs: the `ai` package's Chat and parser on /api/chat — a demo turn, a
    question answered with addToolOutput, an approval, a reloaded page, a cut resumed with GET
    …/stream, cancel (docs/frontends.md#the-ai-sdk)."""
    await run_node_tests(JS_TESTS / "aisdk.test.mjs", js_gateway)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_ag_ui_client_against_a_real_gateway(js_gateway: dict[str, str]) -> None:
    """tests/js/agui.test.mjs: @ag-ui/client's HttpAgent on /agui, every event schema-valid and no
    `[ag-ui]` warning — a demo turn, an interrupt and its resume, an approval, a reloaded thread, a cut
    run reattached (docs/frontends.md#ag-ui)."""
    await run_node_tests(JS_TESTS / "agui.test.mjs", js_gateway)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("js_gateway", ["auth"], indirect=True)  # access modes are token claims
async def test_the_mcp_sdk_client_against_a_real_gateway(js_gateway: dict[str, str]) -> None:
    """tests/js/mcp.test.mjs: @modelcontextprotocol/sdk's Client on /mcp (docs/design.md#mcp-face) —
    the tool list in observe and execute, list_changed, search_capabilities, the ask-mode notice, the
    exploration budget, approvals through elicitation, a /ws subscriber seeing the calls, a foreign
    conversation refused, a cancelled call. The access modes come from token claims: with auth only."""
    await run_node_tests(JS_TESTS / "mcp.test.mjs", js_gateway)
