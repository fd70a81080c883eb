"""Execute confirmation over a real gateway (docs/design.md#execute-confirmation), on both backends:
a tool of the team's own (`acme.cancel_order`, `confirm = true`) that writes each run to a file —
the side-effect counter — so "ran exactly once" and "never ran" are facts outside the runtime.

- approved: runs once; denied, or unanswered in time: never runs, and the model reads why;
- "approve all" covers the rest of the turn only;
- a crash between an approval and the run: on the local backend `reactgate serve` is SIGKILLed
  while the turn waits on its second approval, and a new process on the same store takes over; on
  Ray every ConversationHost process is SIGKILLed and the Directory re-activates the conversation.
  Either way the approved call runs once, the undecided one is asked again, nothing runs twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from actors.agent import load_agent
from tests.e2e import ServeProcess, local_ray, token
from tests.kit import TIMEOUT, Client, client
from tests.roundkit import action, call, complete, thinking

SECRET = "confirm-e2e-secret-for-hs256-32-bytes!"
HOST_RESTART_S = 90.0   # the bound on a host's replacement and the turn's resumption (a condition wait)

TOOLS = '''
import os
from actors.tools import tool


@tool(trait="exploitation", safety="write", confirm=True, description="Cancel an order.")
def cancel_order(order_id: str) -> dict:
    with open(os.environ["ACME_RUNS"], "a") as runs:   # the side-effect counter
        runs.write(order_id + "\\n")
    return {"cancelled": order_id}
'''


def _round(*parts: str) -> dict[str, Any]:
    return {"text": thinking("Working.") + "".join(parts), "chunk_chars": 16}


CANCEL = {
    "one": [_round(action(call("acme.cancel_order", order_id="A1"))), _round(action(complete("Done with A1.")))],
    "two": [_round(action(call("acme.cancel_order", order_id="A1")), action(call("acme.cancel_order", order_id="B2"))),
            _round(action(complete("Done with A1 and B2.")))],
}
SCRIPT = {"by_message": {name: {"rounds": rounds, "loop": True} for name, rounds in CANCEL.items()}}


def _profile(runs: Path, timeout_s: float) -> str:
    return textwrap.dedent(f'''
        name = "acme"
        model = "scripted/unused"
        [policies]
        ask_user_timeout_s = {timeout_s}
        flush_interval_ms = 10
        [[tools]]
        id = "acme.cancel_order"
        impl = "acme_tools:cancel_order"
    ''')


@pytest.fixture
def agent_dir(tmp_path: Path) -> Path:
    (tmp_path / "acme_tools.py").write_text(TOOLS)
    (tmp_path / "script.json").write_text(json.dumps(SCRIPT))
    return tmp_path


def runs(agent_dir: Path) -> list[str]:
    path = agent_dir / "runs.log"
    return path.read_text().split() if path.exists() else []


async def approvals_and_done(c: Client, cid: str, answers: dict[str, str | None], turn_id: str = "t1",
                             timeout: float = TIMEOUT) -> dict[str, Any]:
    """Answer each approval request of the conversation as `answers` says (by order id; None or
    absent: leave it unanswered), until the turn's turn.completed. A request asked again (after a
    crash: a new event, the same ask_id) is answered again: an answer sent before it was asked
    again found no question waiting."""
    answered: set[int] = set()   # the seqs of the requests answered

    def next_step() -> tuple[str, dict[str, Any]] | None:
        for e in c.events.get(cid, []):
            data = e["data"]
            if e["event"] == "ask_user" and data.get("kind") == "approval" and e["seq"] not in answered:
                answered.add(e["seq"])
                return "ask", data
            if e["event"] == "turn.completed" and data["turn_id"] == turn_id:
                return "done", data
        return None

    while True:
        step, data = await c.until(next_step, timeout)
        if step == "done":
            return data
        answer = answers.get(data["params"]["order_id"])
        if answer is not None:
            await c.send(type="answer", conversation_id=cid, ask_id=data["ask_id"], answer=answer)


def decisions(c: Client, cid: str) -> list[tuple[str, str]]:
    return [(e["data"]["call_id"], e["data"]["decision"]) for e in c.events[cid]
            if e["event"] == "trace" and e["data"]["kind"] == "approval"]


def results(c: Client, cid: str) -> dict[str, dict[str, Any]]:
    return {e["data"]["call_id"]: e["data"] for e in c.events[cid] if e["event"] == "tool.result"}


# -- the servers ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def serve(agent_dir: Path, *, timeout_s: float = 300, name: str = "serve") -> AsyncIterator[ServeProcess]:
    (agent_dir / "acme.toml").write_text(_profile(agent_dir / "runs.log", timeout_s))
    process = ServeProcess(agent_dir / "store.sqlite3", agent_dir / f"{name}.log",
                           args=["--agent", str(agent_dir / "acme.toml"), "--script", str(agent_dir / "script.json")],
                           env={"REACTGATE_AUTH_SECRET": SECRET, "ACME_RUNS": str(agent_dir / "runs.log")})
    await process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def ray_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A Ray of this module's own, and the agent loaded as `serve` loads it."""
    from actors.llm.scripts import register_script

    root = tmp_path_factory.mktemp("confirm-ray")
    (root / "acme_tools.py").write_text(TOOLS)
    (root / "script.json").write_text(json.dumps(SCRIPT))
    (root / "acme.toml").write_text(_profile(root / "runs.log", 300))
    os.environ["ACME_RUNS"] = str(root / "runs.log")   # the tool pool's worker reads it
    register_script("confirm-acme", root / "script.json")
    with ThreadPoolExecutor(1) as thread:   # a fixture a running test asks for: no asyncio.run on its loop
        agent = thread.submit(asyncio.run, load_agent(root / "acme.toml")).result()
    with local_ray({"ACME_RUNS": str(root / "runs.log")}):
        yield {"root": root, "agent": agent}


@asynccontextmanager
async def ray_gateway(ray_agent: dict[str, Any]) -> AsyncIterator[tuple[str, Any]]:
    from actors.ray.backend import RayBackend
    from actors.ray.config import RayConfig
    from gateway.server import GatewayServer
    from gateway.settings import Settings

    root, agent = ray_agent["root"], ray_agent["agent"]
    profile = agent.profile.with_script("confirm-acme")
    # A twin whose approvals time out at once, for the unanswered case.
    quick = profile.model_copy(update={"name": "acme-quick", "policies": profile.policies.model_copy(
        update={"ask_user_timeout_s": 0.2})})
    config = RayConfig(store_url=f"sqlite:///{root / 'ray.sqlite3'}", registry=agent.registry,
                       profiles={"acme": profile, "acme-quick": quick},
                       scripts={"confirm-acme": str(root / "script.json")}, hosts=1)
    backend = RayBackend(config, default_agent="acme")
    server = GatewayServer(Settings(host="127.0.0.1", port=0, backend="ray", auth_secret=SECRET), backend)
    host, port = await server.start()
    try:
        yield f"ws://{host}:{port}/ws", backend
    finally:
        await server.drain()


@asynccontextmanager
async def gateway_of(backend: str, agent_dir: Path, ray_agent_request: pytest.FixtureRequest,
                     timeout_s: float = 300) -> AsyncIterator[tuple[str, Path]]:
    """A gateway URL on `backend` and the directory its runs.log is in."""
    if backend == "local":
        async with serve(agent_dir, timeout_s=timeout_s) as process:
            yield process.url, agent_dir
        return
    ray_agent = ray_agent_request.getfixturevalue("ray_agent")
    (ray_agent["root"] / "runs.log").unlink(missing_ok=True)
    async with ray_gateway(ray_agent) as (url, _):
        yield url, ray_agent["root"]


BACKENDS = ["local", pytest.param("ray", marks=pytest.mark.ray)]


# -- approve, deny, time out, approve all ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_approved_call_runs_once_and_a_denied_one_never(
    backend: str, agent_dir: Path, request: pytest.FixtureRequest,
) -> None:
    async with gateway_of(backend, agent_dir, request) as (url, where), client(url, bearer=token("alice", secret=SECRET)) as c:
        yes = await c.open()
        await c.subscribe(yes)
        await c.say(yes, "one: cancel A1", id="m1")
        done = await approvals_and_done(c, yes, {"A1": "Approve"})
        assert done["reason"] == "complete" and runs(where) == ["A1"]
        assert decisions(c, yes) == [("t1.1.0", "approved")] and results(c, yes)["t1.1.0"]["ok"]

        no = await c.open()
        await c.subscribe(no)
        await c.say(no, "one: cancel A1", id="m2")
        await approvals_and_done(c, no, {"A1": "Deny"})
        assert runs(where) == ["A1"]                                   # never ran again
        denied = results(c, no)["t1.1.0"]
        assert (denied["ok"], denied["error"], denied["detail"]["decision"]) == (False, "denied_by_user", "denied")


@pytest.mark.parametrize("backend", BACKENDS)
async def test_approve_all_covers_the_rest_of_the_turn_only(
    backend: str, agent_dir: Path, request: pytest.FixtureRequest,
) -> None:
    async with gateway_of(backend, agent_dir, request) as (url, where), client(url, bearer=token("alice", secret=SECRET)) as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, "two: cancel A1 and B2", id="m1")
        await approvals_and_done(c, cid, {"A1": "Approve all"})
        assert sorted(runs(where)) == ["A1", "B2"] and decisions(c, cid) == [("t1.1.0", "approved_all")]
        await c.say(cid, "two: again", id="m2")                          # the next turn asks again
        await approvals_and_done(c, cid, {"A1": "Approve", "B2": "Deny"}, turn_id="t2")
        assert sorted(runs(where)) == ["A1", "A1", "B2"]
        assert decisions(c, cid)[1:] == [("t2.1.0", "approved"), ("t2.1.1", "denied")]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_approval_nobody_answers_times_out_and_the_call_never_runs(
    backend: str, agent_dir: Path, request: pytest.FixtureRequest,
) -> None:
    agent = "acme" if backend == "local" else "acme-quick"
    async with gateway_of(backend, agent_dir, request, timeout_s=0.2) as (url, where), client(
            url, bearer=token("alice", secret=SECRET)) as c:
        cid = await c.open(agent=agent)
        await c.subscribe(cid)
        await c.say(cid, "one: cancel A1", id="m1")
        await approvals_and_done(c, cid, {})
    assert runs(where) == [] and decisions(c, cid) == [("t1.1.0", "timeout")]
    assert results(c, cid)["t1.1.0"]["detail"]["decision"] == "timeout"


# -- a crash between the approval and the run --------------------------------------------------------------------


async def _first_approved_second_asked(c: Client, cid: str) -> None:
    """Approve A1, then stop answering: the turn waits on B2's approval, A1 approved, not yet run."""
    first = await c.event(cid, "ask_user", kind="approval")
    assert first["data"]["params"] == {"order_id": "A1"}
    await c.send(type="answer", conversation_id=cid, ask_id=first["data"]["ask_id"], answer="Approve")
    await c.event(cid, "trace", kind="approval", call_id=first["data"]["ask_id"])
    second = await c.event(cid, "ask_user", kind="approval", ask_id="t1.1.1")
    assert second["data"]["params"] == {"order_id": "B2"}


async def test_a_server_killed_between_an_approval_and_the_run_runs_the_approved_call_once(agent_dir: Path) -> None:
    alice = token("alice", secret=SECRET)
    async with serve(agent_dir, name="first") as first, client(first.url, bearer=alice) as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, "two: cancel A1 and B2", id="m1")
        await _first_approved_second_asked(c, cid)
        first.signal(signal.SIGKILL)                       # A1 approved and durable, not run; B2 undecided
        await first.wait()
    assert runs(agent_dir) == []
    seen = c.events[cid]
    async with serve(agent_dir, name="second") as second, client(second.url, bearer=alice) as c2:
        await c2.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await approvals_and_done(c2, cid, {"B2": "Approve"})
    assert done["reason"] == "complete"
    assert sorted(runs(agent_dir)) == ["A1", "B2"]             # each exactly once
    asked_again = [e["data"]["params"]["order_id"] for e in c2.events[cid] if e["event"] == "ask_user"]
    assert asked_again == ["B2"]                               # the durable decision is never asked again


@pytest.mark.ray
async def test_a_host_killed_between_an_approval_and_the_run_runs_the_approved_call_once(
    ray_agent: dict[str, Any],
) -> None:
    import ray

    from actors.ray.names import NAMESPACE

    (ray_agent["root"] / "runs.log").unlink(missing_ok=True)
    async with ray_gateway(ray_agent) as (url, backend), client(url, bearer=token("alice", secret=SECRET)) as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, "two: cancel A1 and B2", id="m1")
        await _first_approved_second_asked(c, cid)
        for name in await backend.hosts():                  # every ConversationHost process dies
            pid = int((await ray.get_actor(name, namespace=NAMESPACE).stats.remote())["pid"])
            os.kill(pid, signal.SIGKILL)
        # A replacement host starts cold (a process, the store, LiteLLM): 8-12 s here, more when loaded.
        done = await approvals_and_done(c, cid, {"B2": "Approve"}, timeout=HOST_RESTART_S)
    assert done["reason"] == "complete"
    assert sorted(runs(ray_agent["root"])) == ["A1", "B2"]
    asked = [e["data"]["params"]["order_id"] for e in c.events[cid] if e["event"] == "ask_user"]
    assert asked == ["A1", "B2", "B2"]                         # B2 asked again after the crash, A1 never
