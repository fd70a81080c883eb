"""MCP servers as tool sources (docs/design.md#mcp-servers), against real servers: a small MCPServer
run as a stdio subprocess and over streamable HTTP on loopback. No part of the SDK is mocked.

Every wait is a condition bounded by a generous timeout; no test asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from actors.catalog import Safety, Trait
from actors.profile import McpServerConfig, McpToolEntry
from actors.tools.mcp import (
    RESTART_BACKOFF,
    Backoff,
    McpCallFailed,
    McpError,
    McpSessions,
    McpToolSpec,
    discover,
    sessions,
    stdio_command,
)

BOUND_S = 20.0   # a generous bound for one condition


def server_main(server: str) -> str:
    """The end of a test MCP server script whose server object is named `server`: stdio with no
    argument, streamable HTTP on the port in argv[1]; with argv[2], "handshake-era", the HTTP server
    as one from before MCP's 2026 protocol answers a client (shared with tests/test_agent_hosting.py);
    "forgetful", such a server that answers every tool call as a session it no longer knows — with the
    HTTP status and body in argv[3] (JSON) — counting them in $NOTES_STARTED."""
    return """

def handshake_era_only(app, refusal):
    \"\"\"`app` as a server from before MCP's 2026 protocol answers a client: it knows only the initialize
    handshake and its sessions, and refuses any other request as 2025-era SDK servers did.\"\"\"
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    async def refuse(send, status, content_type, body):
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": body})

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            version = headers.get(b"mcp-protocol-version", b"").decode()
            if version and version not in HANDSHAKE_PROTOCOL_VERSIONS:
                return await refuse(send, 400, b"text/plain", b"Bad Request: Missing session ID")
            if refusal is not None and scope["method"] == "POST":
                body, more = b"", True
                while more:
                    message = await receive()
                    body, more = body + message.get("body", b""), message.get("more_body", False)
                if b'"tools/call"' in body:
                    with open(os.environ["NOTES_STARTED"], "a") as calls:
                        calls.write("x")
                    status, body = refusal
                    return await refuse(send, status, b"application/json" if body.startswith("{") else b"text/plain",
                                        body.encode())
                replay, original = [{"type": "http.request", "body": body, "more_body": False}], receive

                async def receive():   # the body again, for the app
                    return replay.pop() if replay else await original()
        await app(scope, receive, send)
    return asgi


if __name__ == "__main__":
    if len(sys.argv) > 2:   # sys.argv[2]: "handshake-era", or "forgetful" and its refusal
        import json, uvicorn
        refusal = json.loads(sys.argv[3]) if sys.argv[2] == "forgetful" else None
        uvicorn.run(handshake_era_only(SERVER.streamable_http_app(), refusal), host="127.0.0.1",
                    port=int(sys.argv[1]), log_level="warning")
    elif len(sys.argv) > 1:
        SERVER.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
    else:
        SERVER.run()
""".replace("SERVER", server)


NOTES_SERVER = '''
import os
import pathlib
import sys

import anyio
from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

mcp = MCPServer("notes", log_level="WARNING")
NOTES: dict[str, str] = {}


@mcp.tool()
def read_note(key: str) -> str:
    """Read the note stored under key."""
    return NOTES.get(key, "")


@mcp.tool()
def write_note(key: str, text: str) -> dict[str, int]:
    """Store a note under key."""
    NOTES[key] = text
    return {"count": len(NOTES)}


@mcp.tool()
async def slow(seconds: float) -> str:
    """Sleep, after touching $NOTES_STARTED so a test knows the call arrived."""
    pathlib.Path(os.environ["NOTES_STARTED"]).touch()
    await anyio.sleep(seconds)
    return "done"


@mcp.tool()
def fail() -> str:
    """Always fails."""
    raise ToolError("the note store is on fire")


@mcp.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@mcp.tool()
def card(key: str) -> dict:
    """A dict with no output schema: MCPServer sends it as JSON text only."""
    return {"key": key, "text": NOTES.get(key, ""), "tags": ["a", "b"]}


@mcp.tool()
def card_unannotated(key: str):
    """The same, with no return annotation at all."""
    return {"key": key, "nested": {"n": 1}}


@mcp.tool(structured_output=False)
def json_list() -> str:
    """Text that is JSON, but not an object."""
    return "[1, 2]"


@mcp.tool(structured_output=False)
def plain() -> str:
    """Unstructured text only."""
    return "just text"


@mcp.tool(structured_output=False)
def snapshot() -> list:
    """A caption and an image."""
    return ["a caption", Image(data=b"not really a png", format="png")]
''' + server_main("mcp")

DECLARED = {
    "read_note": McpToolEntry(trait=Trait.EXPLORATION),
    "write_note": McpToolEntry(trait=Trait.EXPLOITATION, safety=Safety.WRITE),
    "slow": McpToolEntry(trait=Trait.NEUTRAL),
    "fail": McpToolEntry(trait=Trait.NEUTRAL),
    "pid": McpToolEntry(trait=Trait.NEUTRAL),
    "card": McpToolEntry(trait=Trait.NEUTRAL),
    "card_unannotated": McpToolEntry(trait=Trait.NEUTRAL),
    "json_list": McpToolEntry(trait=Trait.NEUTRAL),
    "plain": McpToolEntry(trait=Trait.NEUTRAL),
    "snapshot": McpToolEntry(trait=Trait.NEUTRAL),
}


# --- servers and helpers -----------------------------------------------------------------------


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "notes_server.py"
    path.write_text(NOTES_SERVER, encoding="utf-8")
    return path


@pytest.fixture
def started(tmp_path: Path) -> Path:
    """The file the server's `slow` tool touches when a call reaches it."""
    return tmp_path / "slow-started"


@pytest.fixture
def stdio(script: Path, started: Path) -> McpServerConfig:
    return McpServerConfig(name="notes", command=(sys.executable, str(script)),
                           env={"NOTES_STARTED": str(started)}, tools=DECLARED)


@pytest.fixture
async def pool() -> AsyncIterator[McpSessions]:
    pool = McpSessions()
    yield pool
    await pool.close()


@pytest.fixture
async def patient_pool() -> AsyncIterator[McpSessions]:
    """A pool whose backoff outlasts any test, so that "inside the backoff" depends on no timing."""
    pool = McpSessions(Backoff(first_s=600, max_s=600))
    yield pool
    await pool.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """The notes server over streamable HTTP on 127.0.0.1, as a subprocess that can be killed and
    started again on the same port."""

    def __init__(self, script: Path, started: Path, log: Path, *, era: str = "",
                 refusal: tuple[int, str] | None = None) -> None:
        """`era`: "" (MCP's 2026 protocol), "handshake-era", or "forgetful" with its `refusal`, an
        HTTP status and body (`server_main`)."""
        self.script, self.started, self.log = script, started, log
        self.era = [era, *([json.dumps(refusal)] if refusal else [])] if era else []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(self.script), str(self.port), *self.era], stdout=log, stderr=log,
                                         env={**os.environ, "NOTES_STARTED": str(self.started)})
        deadline = time.monotonic() + BOUND_S
        while not self._accepts():
            assert self.proc.poll() is None, f"the HTTP server exited: {self.log.read_text()}"
            assert time.monotonic() < deadline, "the HTTP server did not accept connections in time"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=BOUND_S)

    def _accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False


@pytest.fixture
def http_server(script: Path, started: Path, tmp_path: Path) -> Iterator[HttpServer]:
    server = HttpServer(script, started, tmp_path / "http-server.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def http(http_server: HttpServer) -> McpServerConfig:
    return McpServerConfig(name="notes", url=http_server.url, tools=DECLARED)


async def answer(pool: McpSessions, server: McpServerConfig, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The first successful answer, calling again while the server restarts (bounded)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        try:
            return await pool.call(server, tool, arguments)
        except McpCallFailed:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def running(pid: int) -> bool:
    """The process exists and is not a zombie awaiting its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children() -> set[int]:
    """This process's running child processes."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            except FileNotFoundError:
                continue
            if fields[1] == str(os.getpid()) and fields[0] != "Z":   # state, ppid
                found.add(int(entry))
    return found


def ended(pool: McpSessions, server: str) -> bool:
    """The pool's session with `server` has seen its end (and no call has dropped it yet)."""
    connection = pool._slots[server].connection
    return connection is not None and not connection.alive


async def until(predicate: Any) -> None:
    deadline = time.monotonic() + BOUND_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


# --- configuration -----------------------------------------------------------------------------


def test_a_server_has_exactly_one_of_command_and_url() -> None:
    with pytest.raises(ValidationError, match="exactly one of command"):
        McpServerConfig(name="notes", tools=DECLARED)
    with pytest.raises(ValidationError, match="exactly one of command"):
        McpServerConfig(name="notes", command=("python", "s.py"), url="http://127.0.0.1:9000/mcp", tools=DECLARED)


def test_a_server_name_has_no_dot() -> None:
    for name in ("", "my.notes"):
        with pytest.raises(ValidationError, match=r"contain no '\.'"):
            McpServerConfig(name=name, command=("python",), tools=DECLARED)


def test_a_server_declares_at_least_one_tool() -> None:
    with pytest.raises(ValidationError, match="declare at least one tool"):
        McpServerConfig(name="notes", command=("python",), tools={})


def test_timeouts_are_positive_and_env_is_for_commands() -> None:
    with pytest.raises(ValidationError, match="call_timeout_s"):
        McpServerConfig(name="notes", command=("python",), call_timeout_s=0, tools=DECLARED)
    with pytest.raises(ValidationError, match="apply to a command"):
        McpServerConfig(name="notes", url="http://127.0.0.1:9000/mcp", env={"A": "1"}, tools=DECLARED)


def test_a_config_reads_from_toml_shaped_data_and_travels_by_pickle() -> None:
    raw = {"name": "notes", "command": ["python", "notes_server.py"], "env": {"A": "1"},
           "tools": {"read_note": {"trait": "exploration"}, "delete_note": {"trait": "exploitation", "safety": "write"}}}
    config = McpServerConfig.model_validate(raw)
    assert config.command == ("python", "notes_server.py")
    assert config.tools["delete_note"] == McpToolEntry(trait=Trait.EXPLOITATION, safety=Safety.WRITE)
    assert config.tool_id("read_note") == "notes.read_note"
    reordered = McpServerConfig.model_validate({**raw, "tools": dict(reversed(raw["tools"].items()))})
    assert reordered == config and hash(reordered) == hash(config)
    assert pickle.loads(pickle.dumps(config)) == config
    spec = McpToolSpec("notes", "read_note", "Read.", {"type": "object"})
    assert pickle.loads(pickle.dumps(spec)) == spec and hash(spec) == hash(pickle.loads(pickle.dumps(spec)))


# --- discovery ---------------------------------------------------------------------------------


async def test_discovery_returns_the_declared_tools_only_with_their_schemas(stdio: McpServerConfig) -> None:
    server = stdio.model_copy(update={"tools": {"write_note": DECLARED["write_note"], "read_note": DECLARED["read_note"]}})
    specs = await discover(server)
    assert [(s.tool_id, s.description) for s in specs] == [
        ("notes.write_note", "Store a note under key."),
        ("notes.read_note", "Read the note stored under key."),
    ]
    assert specs[0].input_schema["required"] == ["key", "text"]
    assert set(specs[0].input_schema["properties"]) == {"key", "text"}


async def test_discovery_over_http(http: McpServerConfig) -> None:
    specs = await discover(http.model_copy(update={"tools": {"pid": DECLARED["pid"]}}))
    assert [s.tool_id for s in specs] == ["notes.pid"]


async def test_a_declared_tool_the_server_lacks_names_its_field(stdio: McpServerConfig) -> None:
    server = stdio.model_copy(update={"tools": {**DECLARED, "delete_note": McpToolEntry(trait=Trait.EXPLOITATION)}})
    with pytest.raises(McpError) as caught:
        await discover(server)
    assert str(caught.value) == ("mcp_servers.notes.tools.delete_note: the server has no tool 'delete_note' "
                                 "(it has: card, card_unannotated, fail, json_list, pid, plain, read_note, slow, snapshot, write_note)")


async def test_a_server_that_never_answers_is_a_startup_error() -> None:
    server = McpServerConfig(name="notes", command=(sys.executable, "-c", "import time; time.sleep(60)"),
                             startup_timeout_s=1, tools=DECLARED)
    with pytest.raises(McpError, match=r"^mcp_servers\.notes: did not answer within 1 s$"):
        await discover(server)


async def test_a_command_that_cannot_run_is_a_startup_error(tmp_path: Path) -> None:
    server = McpServerConfig(name="notes", command=(str(tmp_path / "no-such-program"),), tools=DECLARED)
    with pytest.raises(McpError, match=r"^mcp_servers\.notes: could not start: FileNotFoundError"):
        await discover(server)


# --- calls -------------------------------------------------------------------------------------


async def test_calls_share_one_server_process(pool: McpSessions, stdio: McpServerConfig) -> None:
    cold = await asyncio.gather(*(pool.call(stdio, "pid", {}) for _ in range(5)))   # one start for all
    assert cold == [cold[0]] * 5
    assert await pool.call(stdio, "pid", {}) == cold[0]
    assert await pool.call(stdio, "write_note", {"key": "k", "text": "hello"}) == {"count": 1}
    assert await pool.call(stdio, "read_note", {"key": "k"}) == {"result": "hello"}   # the same process's memory


async def test_calls_over_http(pool: McpSessions, http: McpServerConfig) -> None:
    assert await pool.call(http, "write_note", {"key": "k", "text": "over http"}) == {"count": 1}
    assert await pool.call(http, "read_note", {"key": "k"}) == {"result": "over http"}


async def test_a_structured_result_is_its_structured_content(pool: McpSessions, stdio: McpServerConfig) -> None:
    assert await pool.call(stdio, "write_note", {"key": "k", "text": "milk"}) == {"count": 1}
    assert set(await pool.call(stdio, "pid", {})) == {"result"}            # a non-object, wrapped


async def test_a_dict_without_an_output_schema_comes_back_as_the_dict(pool: McpSessions, stdio: McpServerConfig) -> None:
    await pool.call(stdio, "write_note", {"key": "k", "text": "milk"})
    assert await pool.call(stdio, "card", {"key": "k"}) == {"key": "k", "text": "milk", "tags": ["a", "b"]}
    assert await pool.call(stdio, "card_unannotated", {"key": "k"}) == {"key": "k", "nested": {"n": 1}}


async def test_json_text_that_is_not_an_object_stays_text(pool: McpSessions, stdio: McpServerConfig) -> None:
    assert await pool.call(stdio, "json_list", {}) == {"content": ["[1, 2]"]}


async def test_a_python_command_runs_this_interpreter(script: Path, started: Path, tmp_path: Path) -> None:
    # A PATH with no Python on it at all: the server still starts, with the interpreter running this test.
    (tmp_path / "empty").mkdir()
    server = McpServerConfig(name="notes", command=("python", str(script)),
                             env={"PATH": str(tmp_path / "empty"), "NOTES_STARTED": str(started)}, tools=DECLARED)
    assert [spec.name for spec in await discover(server)] == list(DECLARED)
    assert stdio_command(("python3", "s.py")) == (sys.executable, ["s.py"])
    assert stdio_command(("node", "s.js")) == ("node", ["s.js"])


async def test_an_unstructured_result_is_its_content(pool: McpSessions, stdio: McpServerConfig) -> None:
    assert await pool.call(stdio, "plain", {}) == {"content": ["just text"]}


async def test_a_non_text_block_is_described_without_its_bytes(pool: McpSessions, stdio: McpServerConfig) -> None:
    assert await pool.call(stdio, "snapshot", {}) == {"content": ["a caption", {"type": "image", "mimeType": "image/png"}]}


async def test_a_tool_error_fails_the_call_with_its_text(pool: McpSessions, stdio: McpServerConfig) -> None:
    with pytest.raises(McpCallFailed, match=r"^notes\.fail: Error executing tool fail: the note store is on fire$"):
        await pool.call(stdio, "fail", {})


async def test_a_tool_error_over_http(pool: McpSessions, http: McpServerConfig) -> None:
    with pytest.raises(McpCallFailed, match=r"^notes\.fail: Error executing tool fail: the note store is on fire$"):
        await pool.call(http, "fail", {})


async def test_a_slow_call_is_cut_at_call_timeout_and_the_session_lives_on(
        pool: McpSessions, stdio: McpServerConfig) -> None:
    server = stdio.model_copy(update={"call_timeout_s": 0.5})
    pid = await pool.call(server, "pid", {})
    with pytest.raises(McpCallFailed, match=r"^notes\.slow: no answer within 0\.5 s$"):
        await pool.call(server, "slow", {"seconds": 60})
    assert await pool.call(server, "pid", {}) == pid


async def test_a_cancelled_call_leaves_the_session_to_the_others(
        pool: McpSessions, stdio: McpServerConfig, started: Path) -> None:
    pid = await pool.call(stdio, "pid", {})
    steered = asyncio.create_task(pool.call(stdio, "slow", {"seconds": 60}))
    await until(started.exists)
    other = asyncio.create_task(pool.call(stdio, "write_note", {"key": "k", "text": "still here"}))
    steered.cancel()
    with pytest.raises(asyncio.CancelledError):
        await steered
    assert await other == {"count": 1}
    assert await pool.call(stdio, "pid", {}) == pid


# --- a server that dies ------------------------------------------------------------------------


async def test_a_server_killed_mid_call_fails_that_call_and_the_next_call_starts_it_again(
        pool: McpSessions, stdio: McpServerConfig, started: Path) -> None:
    pid = (await pool.call(stdio, "pid", {}))["result"]
    in_flight = asyncio.create_task(pool.call(stdio, "slow", {"seconds": 60}))
    await until(started.exists)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is unavailable: the connection closed$"):
        await in_flight
    restarted = (await pool.call(stdio, "pid", {}))["result"]
    assert restarted != pid and running(restarted)


async def test_a_server_killed_between_calls_is_started_again_by_the_next_call(
        pool: McpSessions, stdio: McpServerConfig) -> None:
    # The next call sent nothing to the dead server, so it has no death to report: it starts a new one.
    pid = (await pool.call(stdio, "pid", {}))["result"]
    os.kill(pid, signal.SIGKILL)
    await until(lambda: ended(pool, "notes"))
    restarted = (await pool.call(stdio, "pid", {}))["result"]
    assert restarted != pid and running(restarted)
    assert await pool.call(stdio, "pid", {}) == {"result": restarted}


def gated(script: Path, ready: Path, starts: Path) -> tuple[str, ...]:
    """The notes server, once `ready` exists; until then a start that fails (and is counted)."""
    program = ("import os, runpy, sys\n"
               "ready, starts, script = sys.argv[1:]\n"
               "if not os.path.exists(ready):\n"
               "    open(starts, 'a').write('x')\n"
               "    sys.exit(3)\n"
               "sys.argv = [script]\n"
               "runpy.run_path(script, run_name='__main__')\n")
    return (sys.executable, "-c", program, str(ready), str(starts), str(script))


async def test_a_server_that_keeps_failing_is_left_alone_during_the_backoff(
        patient_pool: McpSessions, stdio: McpServerConfig, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    server = stdio.model_copy(update={"command": gated(Path(stdio.command[1]), tmp_path / "never", starts)})
    for _ in range(2):   # one failure is retried at once; the second starts the backoff
        with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is unavailable: could not start: "):
            await patient_pool.call(server, "pid", {})
    with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is restarting: next attempt in \d+\.\d s "
                                            r"\(last error: could not start: the connection closed\)$"):
        await patient_pool.call(server, "pid", {})
    assert starts.read_text() == "xx"   # no start inside the backoff


async def test_the_first_call_after_the_backoff_starts_the_server_again(
        pool: McpSessions, stdio: McpServerConfig, tmp_path: Path) -> None:
    ready, starts = tmp_path / "ready", tmp_path / "starts"
    server = stdio.model_copy(update={"command": gated(Path(stdio.command[1]), ready, starts)})
    for _ in range(2):
        with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is unavailable: could not start: "):
            await pool.call(server, "pid", {})
    ready.touch()
    assert "result" in await answer(pool, server, "pid", {})   # calls inside the backoff fail at once
    assert starts.read_text() == "xx"


async def test_a_server_that_died_between_calls_and_will_not_start_again_is_left_alone(
        patient_pool: McpSessions, stdio: McpServerConfig, tmp_path: Path) -> None:
    ready, starts = tmp_path / "ready", tmp_path / "starts"
    server = stdio.model_copy(update={"command": gated(Path(stdio.command[1]), ready, starts)})
    ready.touch()
    pid = (await patient_pool.call(server, "pid", {}))["result"]
    ready.unlink()
    os.kill(pid, signal.SIGKILL)
    await until(lambda: ended(patient_pool, "notes"))
    with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is unavailable: could not start: "):
        await patient_pool.call(server, "pid", {})   # the death, then a failed start: two in a row
    with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is restarting: next attempt in "):
        await patient_pool.call(server, "pid", {})
    assert starts.read_text() == "x"


def test_the_restart_backoff_waits_nothing_after_one_failure_then_doubles_up_to_five_seconds() -> None:
    assert [RESTART_BACKOFF.delay_s(n) for n in range(1, 9)] == [0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]


async def test_an_http_server_that_restarts_is_found_again(
        pool: McpSessions, http: McpServerConfig, http_server: HttpServer) -> None:
    pid = (await pool.call(http, "pid", {}))["result"]
    http_server.stop()
    with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is unavailable: "):
        await pool.call(http, "pid", {})
    http_server.start()
    restarted = (await answer(pool, http, "pid", {}))["result"]
    assert restarted != pid


@pytest.mark.parametrize("era", ["", "handshake-era"], ids=["2026-protocol", "handshake-era"])
async def test_an_http_server_restarted_between_calls_answers_the_next_call(
        pool: McpSessions, script: Path, started: Path, tmp_path: Path, era: str) -> None:
    # Nothing was in flight when it went away, so the next call must not fail for it either. A server
    # of the handshake era answers HTTP 404 to the session it lost with its restart: it ran nothing.
    server = HttpServer(script, started, tmp_path / "http-server.log", era=era)
    server.start()
    try:
        http = McpServerConfig(name="notes", url=server.url, tools=DECLARED)
        pid = (await pool.call(http, "pid", {}))["result"]
        server.stop()
        server.start()
        restarted = (await pool.call(http, "pid", {}))["result"]
        assert restarted != pid and running(restarted)
        assert await pool.call(http, "pid", {}) == {"result": restarted}
    finally:
        server.stop()


def rpc_error(code: int, message: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}})


# Every refusal of actors/tools/mcp.py `_SESSION_GONE`, as the servers send it, and what the model reads.
REFUSALS = {
    "bare-404": ((404, "Not Found"), "Session terminated"),
    "python-sdk": ((404, rpc_error(-32600, "Session not found")), "Session not found"),
    "typescript-sdk": ((404, rpc_error(-32001, "Session not found")), "Session not found"),
    "typescript-restarted": ((400, rpc_error(-32000, "Bad Request: Server not initialized")),
                             "Bad Request: Server not initialized"),
    "typescript-examples": ((400, rpc_error(-32000, "Bad Request: No valid session ID provided")),
                            "Bad Request: No valid session ID provided"),
}


@pytest.mark.parametrize("refusal", REFUSALS)
async def test_a_server_that_forgets_the_new_session_too_fails_the_call_after_one_more_try(
        pool: McpSessions, script: Path, started: Path, tmp_path: Path, refusal: str) -> None:
    answer, reason = REFUSALS[refusal]
    server = HttpServer(script, started, tmp_path / "http-server.log", era="forgetful", refusal=answer)
    server.start()
    try:
        http = McpServerConfig(name="notes", url=server.url, tools=DECLARED)
        with pytest.raises(McpCallFailed, match=rf"^mcp server 'notes' is unavailable: {reason}$"):
            await pool.call(http, "pid", {})
        assert started.read_text() == "xx"   # the call, and once more on a new session: no further
    finally:
        server.stop()


# --- lifetime ----------------------------------------------------------------------------------


async def test_an_undeclared_tool_is_never_called(pool: McpSessions, stdio: McpServerConfig) -> None:
    server = stdio.model_copy(update={"tools": {"read_note": DECLARED["read_note"]}})
    with pytest.raises(ValueError, match=r"^notes\.pid is not a declared tool"):
        await pool.call(server, "pid", {})


async def test_close_during_a_start_fails_the_waiting_call_and_stops_the_process(stdio: McpServerConfig) -> None:
    before = children()
    pool = McpSessions()
    waiting = asyncio.create_task(pool.call(stdio, "pid", {}))
    await until(lambda: children() - before)   # the server process is starting
    await pool.close()
    with pytest.raises(McpCallFailed, match=r"^mcp server 'notes' is unavailable: its start was stopped$"):
        await waiting
    assert children() - before == set()


async def test_close_leaves_no_server_process(stdio: McpServerConfig) -> None:
    pool = McpSessions()
    pid = (await pool.call(stdio, "pid", {}))["result"]
    assert running(pid)
    await pool.close()
    assert not running(pid)
    # The pool may serve again: a new process.
    again = (await pool.call(stdio, "pid", {}))["result"]
    await pool.close()
    assert again != pid and not running(again)


async def test_discovery_leaves_no_server_process(stdio: McpServerConfig) -> None:
    before = children()
    await discover(stdio)
    assert children() - before == set()


async def test_one_pool_per_process_and_loop() -> None:
    assert sessions() is sessions()
    assert sessions().runs_on(asyncio.get_running_loop())
