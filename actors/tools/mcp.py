"""Talking to an agent's MCP servers (docs/design.md#mcp-servers), with the official `mcp` SDK (2.x).

Two uses, two entry points. At start-up, `discover` starts a server once, checks that it offers
every tool the profile declares and returns their specs, then stops it: a server that lacks a
declared tool or does not answer within `startup_timeout_s` is an `McpError` naming the profile
field, never a crash later on a host (docs/design.md#your-own-agent). At run time, `McpSessions`
(one per process, `sessions()`) keeps one live session per server — one stdio process per host per
server, not per call — shared by every turn that calls its tools.

A call's failure is an `McpCallFailed` whose text the executor hands the model as a failed
observation (docs/design.md#observations): the tool's own `isError` text, a cut at
`call_timeout_s`, or a server that died. A dead server fails only the calls that were in flight
on it; its session is dropped and the next call starts it again — whether the death was met by a
call or happened between calls — so the next turn finds it back. An HTTP server that answers
that it no longer knows the session (it restarted) ran nothing: the call goes once more on a new
session (docs/design.md#mcp-servers). A server
that keeps failing — it dies again before answering a call, or will not start — is left alone for
an exponential backoff (`RESTART_BACKOFF`: 0.2 s doubling to 5 s), and calls inside it fail at once
("restarting") rather than piling onto a server that keeps dying.

The SDK's transports are anyio context managers that must be entered and exited by one task, but a
shared session is used by many turns' tasks, any of which may be steered or cancelled. So each
session lives inside a task of its own (`_Connection`); callers only send requests through it, and
a cancelled caller abandons its own request (the SDK sends the server a cancellation) without
touching the session the others use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
from mcp import Client, MCPError, StdioServerParameters, types
from mcp.client import Transport
from mcp.client.stdio import stdio_client

from actors.profile import McpServerConfig

log = logging.getLogger("reactgate.tools.mcp")


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long a server is left alone after `failures` in a row (deaths and failed starts since a
    call last got an answer): none after one, so a server that died once is back for the next call;
    then `first_s`, doubling with each further failure, up to `max_s`."""

    first_s: float
    max_s: float

    def delay_s(self, failures: int) -> float:
        if failures <= 1:
            return 0.0
        return min(self.first_s * 2.0 ** (failures - 2), self.max_s)


RESTART_BACKOFF: Final = Backoff(first_s=0.2, max_s=5.0)

CLIENT_INFO: Final = types.Implementation(name="reactgate", version="0.1.0")

# A server of MCP's handshake era that no longer knows our session (it restarted, or expired it)
# refuses the request, having run nothing, and the transport's rule is to start a new session. The
# SDK's client reports the refusal as the server's own JSON-RPC error when it carries one, else as
# "Session terminated" (a bare 404). What the servers say, as they say it:
_SESSION_GONE: Final = frozenset({
    (types.INVALID_REQUEST, "Session terminated"),          # a 404 with no JSON-RPC error (the SDK client's)
    (types.INVALID_REQUEST, "Session not found"),           # 404, the Python SDK's servers
    (-32001, "Session not found"),                          # 404, the TypeScript SDK's transport
    (-32000, "Bad Request: Server not initialized"),        # 400, the same, restarted with a single session
    (-32000, "Bad Request: No valid session ID provided"),  # 400, the TypeScript SDK's examples' session map
})




@dataclass(frozen=True, slots=True)
class McpToolSpec:
    """What discovery found for one declared tool: the server's description and inputSchema."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]

    @property
    def tool_id(self) -> str:
        return f"{self.server}.{self.name}"

    def __hash__(self) -> int:  # input_schema is a dict: equal specs still hash alike
        return hash((self.server, self.name, self.description))


class McpError(Exception):
    """A server that cannot serve the profile: `<field path>: <reason>`, e.g.
    `mcp_servers.notes: did not answer within 10 s`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class McpCallFailed(Exception):
    """A call that produced no result; its text is what the model is told."""


# --- discovery ---------------------------------------------------------------------------------


async def discover(server: McpServerConfig) -> list[McpToolSpec]:
    """The specs of the server's declared tools, in declared order; undeclared tools are ignored.

    Starts (or connects to) the server, lists its tools within `startup_timeout_s`, and stops it.
    """
    connection = _Connection(server)
    await connection.open()
    await connection.close()
    offered = {tool.name: tool for tool in connection.tools}
    for name in server.tools:
        if name not in offered:
            has = ", ".join(sorted(offered)) or "no tools"
            raise McpError(f"mcp_servers.{server.name}.tools.{name}",
                           f"the server has no tool '{name}' (it has: {has})")
    return [McpToolSpec(server.name, name, offered[name].description or "", dict(offered[name].input_schema))
            for name in server.tools]


# --- sessions ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Slot:
    """One server's place in the pool: its live connection, the start in progress, or when it may
    be tried again."""

    server: McpServerConfig
    connection: _Connection | None = None
    opening: asyncio.Task[_Connection] | None = None
    failures: int = 0        # deaths and failed starts since the last successful call
    retry_at: float = 0.0    # loop time before which no start is attempted
    last_error: str = ""


class McpSessions:
    """This process's live MCP sessions, one per server name, shared by every caller.

    Create it on the loop that uses it; `close()` stops every session and server process.
    """

    def __init__(self, backoff: Backoff = RESTART_BACKOFF) -> None:
        self._backoff = backoff
        self._loop = asyncio.get_running_loop()
        self._slots: dict[str, _Slot] = {}
        self._background: set[asyncio.Task[Any]] = set()   # sessions being closed, starts being cancelled

    def runs_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        return self._loop is loop

    async def call(self, server: McpServerConfig, tool: str, arguments: dict[str, Any],
                   meta: dict[str, Any] | None = None) -> dict[str, Any]:
        """Call a declared `tool` on `server`, starting the server's session if there is none.

        The result is always a JSON object, as an observation is one: the tool's
        `structuredContent` when it gives one (an object as is, any other JSON value as
        `{"result": value}`, as for function tools, docs/design.md#your-tools); else a lone text
        block holding a JSON object, as that object (MCPServer's way with a dict it has no output
        schema for); otherwise `{"content": [...]}`, one item per content block — a text block as its text, any other
        block as its MCP JSON without its base64 payload (the model reads text; the bytes of an
        image would only eat its context). Anything else is `McpCallFailed`, whose text is what
        the model should read: the tool's `isError` text, a cut at `call_timeout_s`, a protocol
        error, the server being unavailable or restarting.
        """
        if tool not in server.tools:   # only declared tools are ever offered, so never called
            raise ValueError(f"{server.tool_id(tool)} is not a declared tool of mcp server '{server.name}'")
        slot = self._slot(server)
        try:
            result = await self._call_once(slot, tool, arguments, meta, may_resend=True)
        except _SessionGone:
            # The server ran nothing (it no longer knew the session), so the call goes once more,
            # on a new session; a second such answer fails it.
            result = await self._call_once(slot, tool, arguments, meta, may_resend=False)
        slot.failures = 0
        if result.is_error:
            raise McpCallFailed(f"{server.tool_id(tool)}: {_text(result) or 'the tool reported an error'}")
        return _result_json(result)

    async def _call_once(self, slot: _Slot, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None,
                         *, may_resend: bool) -> types.CallToolResult:
        """One try of a call on the slot's session; `_SessionGone` when the server answered that it
        no longer knows the session and `may_resend`."""
        server = slot.server
        connection = await self._connection(slot)
        deadline = asyncio.timeout(server.call_timeout_s)
        try:
            async with deadline:
                return await connection.call_tool(tool, arguments, meta)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and deadline.expired():
                # The SDK told the server to stop; the session itself is fine.
                raise McpCallFailed(f"{server.tool_id(tool)}: no answer within {server.call_timeout_s:g} s") from None
            gone = _session_gone(exc)
            if gone or _closed(exc) or not connection.alive:
                reason = connection.ended or _describe(exc)
                self._lose(slot, connection, reason)
                if gone and may_resend:
                    raise _SessionGone from exc
                raise McpCallFailed(_unavailable(server, reason)) from exc
            raise McpCallFailed(f"{server.tool_id(tool)}: {_describe(exc)}") from exc

    async def close(self) -> None:
        """Stop every session and server process; the pool may be used again afterwards."""
        slots, self._slots = list(self._slots.values()), {}
        for slot in slots:
            self._retire(slot)
        while self._background:
            await asyncio.wait(list(self._background))

    def _slot(self, server: McpServerConfig) -> _Slot:
        slot = self._slots.get(server.name)
        if slot is None or (slot.server is not server and slot.server != server):
            if slot is not None:   # the profile changed this server: its old session goes
                self._retire(slot)
            slot = self._slots[server.name] = _Slot(server)
        return slot

    async def _connection(self, slot: _Slot) -> _Connection:
        connection = slot.connection
        if connection is not None:
            if connection.alive:
                return connection
            # It died between calls, or after the call that met its death failed for another
            # reason: nothing was sent on it, so this call starts it again (after the backoff,
            # if it keeps dying) instead of failing for a death it never met.
            self._lose(slot, connection, connection.ended or "the connection closed")
        if slot.opening is None:
            wait = slot.retry_at - self._loop.time()
            if wait > 0:
                raise McpCallFailed(f"mcp server '{slot.server.name}' is restarting: next attempt in "
                                    f"{wait:.1f} s (last error: {slot.last_error})")
            slot.opening = self._loop.create_task(self._open(slot), name=f"mcp-open:{slot.server.name}")
            slot.opening.add_done_callback(_retrieve)
        opening = slot.opening
        try:
            # Shielded: a cancelled caller leaves the start running for the callers that still wait.
            return await asyncio.shield(opening)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if opening.cancelled() and task is not None and not task.cancelling():
                # The pool, not this caller, stopped the start (close(), or a changed config).
                raise McpCallFailed(_unavailable(slot.server, "its start was stopped")) from None
            raise

    async def _open(self, slot: _Slot) -> _Connection:
        connection = _Connection(slot.server)
        try:
            await connection.open()
        except McpError as exc:
            self._failed(slot, exc.reason)
            raise McpCallFailed(_unavailable(slot.server, exc.reason)) from None
        finally:
            slot.opening = None
        if self._slots.get(slot.server.name) is not slot:   # retired while it started
            self._track(self._loop.create_task(connection.close()))
            raise McpCallFailed(f"mcp server '{slot.server.name}' is unavailable: the session pool was closed")
        slot.connection = connection
        return connection

    def _lose(self, slot: _Slot, connection: _Connection, reason: str) -> None:
        """Drop a dead session once, however many calls saw it die, and start the backoff."""
        if slot.connection is not connection:
            return
        slot.connection = None
        self._failed(slot, reason)
        log.warning("mcp server %r lost (%s); next start allowed in %.1f s", slot.server.name, reason,
                    slot.retry_at - self._loop.time())
        self._track(self._loop.create_task(connection.close()))

    def _failed(self, slot: _Slot, reason: str) -> None:
        slot.failures += 1
        slot.last_error = reason
        slot.retry_at = self._loop.time() + self._backoff.delay_s(slot.failures)

    def _retire(self, slot: _Slot) -> None:
        if slot.opening is not None:
            slot.opening.cancel()
            self._track(slot.opening)
        if slot.connection is not None:
            self._track(self._loop.create_task(slot.connection.close()))
            slot.connection = None

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)


_sessions: McpSessions | None = None


def sessions() -> McpSessions:
    """This process's pool, created on first use and bound to the running loop (a new loop, e.g. a
    test's, gets a new pool)."""
    global _sessions
    if _sessions is None or not _sessions.runs_on(asyncio.get_running_loop()):
        _sessions = McpSessions()
    return _sessions


async def close_sessions() -> None:
    """Stop this process's MCP servers, if it started any (a backend shutting down)."""
    if _sessions is not None and _sessions.runs_on(asyncio.get_running_loop()):
        await _sessions.close()


# --- one connection ----------------------------------------------------------------------------


class _Connection:
    """One session with one server, entered and exited by a runner task of its own.

    The runner holds `async with Client(...)` open until `close()` cancels its scope, so the SDK's
    anyio contexts (the stdio process, the HTTP streams) start and stop in that one task whatever
    the callers do. Its end — closed, or the transport failed — is `alive` turning false.
    """

    def __init__(self, server: McpServerConfig) -> None:
        self.server = server
        self.tools: list[types.Tool] = []
        self.ended = ""                      # why the session ended, once it has
        self._client: Client | None = None
        self._settled = asyncio.Event()      # the handshake succeeded or failed
        self._error: Exception | None = None
        self._scope = anyio.CancelScope()
        self._task: asyncio.Task[None] | None = None
        self._eof = False

    @property
    def alive(self) -> bool:
        return self._client is not None and not self._eof

    def _server_ended(self) -> None:
        """The server's side of a stdio pipe ended (its process exited): mark the session dead at
        once, so that a call that comes later starts a new one instead of meeting this one."""
        self._eof = True
        self.ended = self.ended or "the connection closed"

    async def open(self) -> None:
        """Start the server (or connect), shake hands and list its tools, all within
        `startup_timeout_s`; McpError otherwise, with nothing left running."""
        path = f"mcp_servers.{self.server.name}"
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"mcp:{self.server.name}")
        deadline = asyncio.timeout(self.server.startup_timeout_s)
        stage = "could not start"
        try:
            async with deadline:
                await self._settled.wait()
                if self._client is None:
                    raise self._error or RuntimeError("the session ended during start-up")
                stage = "could not list its tools"
                self.tools = await _list_tools(self._client)
        except Exception as exc:
            await self.close()
            if isinstance(exc, TimeoutError) and deadline.expired():
                raise McpError(path, f"did not answer within {self.server.startup_timeout_s:g} s") from None
            raise McpError(path, f"{stage}: {_describe(exc)}") from exc
        except BaseException:
            await self.close()
            raise

    async def call_tool(self, tool: str, arguments: dict[str, Any],
                        meta: dict[str, Any] | None = None) -> types.CallToolResult:
        if self._client is None:
            raise MCPError(types.CONNECTION_CLOSED, self.ended or "the connection closed")
        return await self._client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]

    async def close(self) -> None:
        """Stop the session and wait until its server process is gone (the SDK bounds that wait)."""
        self._scope.cancel()
        if self._task is not None:
            await asyncio.wait([self._task])

    async def _run(self) -> None:
        try:
            with self._scope:
                async with _client(self.server, self._server_ended) as client:
                    self._client = client
                    self._settled.set()
                    await anyio.sleep_forever()
            self.ended = "the session was closed"
        except Exception as exc:   # the transport failed: reported through `alive` and `ended`
            self._error = exc
            self.ended = _describe(exc)
            if self._settled.is_set():
                log.info("mcp server %r: session ended: %s", self.server.name, self.ended)
        finally:
            self._client = None
            self._settled.set()


# A stdio command that opens with one of these runs this process's own interpreter: the server's
# environment is minimal (docs/design.md#mcp-servers), so `python` on its PATH could be any Python,
# one without the mcp SDK the server imports. Any other command runs as found on PATH.
OWN_INTERPRETER: Final = frozenset({"python", "python3"})


def stdio_command(command: tuple[str, ...]) -> tuple[str, list[str]]:
    """The program and arguments a stdio server is started with."""
    program, *args = command
    return (sys.executable if program in OWN_INTERPRETER else program), args


def _client(server: McpServerConfig, on_eof: Callable[[], None]) -> Client:
    """A client for `server`; `on_eof` is called when a stdio server's output ends (it exited)."""
    target: Any
    if server.url is not None:
        target = server.url
    else:
        assert server.command is not None   # the config's validator guarantees one of the two
        program, args = stdio_command(server.command)
        params = StdioServerParameters(command=program, args=args, env=dict(server.env), cwd=server.cwd)
        # The server's stderr goes to this process's own: the SDK's default is whatever `sys.stderr`
        # was when it was imported, which may be a stream with no file behind it (a captured one).
        target = _eof_watched(stdio_client(params, errlog=sys.__stderr__ or sys.stderr), on_eof)
    # No response cache: discovery must see the server as it is, and calls are never cached.
    return Client(target, cache=None, client_info=CLIENT_INFO)


@contextlib.asynccontextmanager
async def _eof_watched(transport: Transport, on_eof: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
    """`transport`, whose read stream calls `on_eof` when it ends.

    The SDK's session notices the end too, but only its waiting requests hear of it: the client
    stays open and a later request fails at once. A server that exited between calls would so fail
    the next call, one that never reached it; with this, that call starts the server again
    (docs/design.md#mcp-servers)."""
    async with transport as (read, write):
        yield _EofWatch(read, on_eof), write


class _EofWatch:
    """A transport's read stream that reports its end: what the SDK's session uses of one (receive,
    `async for`, `async with`, and `last_context` where the stream has it) is passed through."""

    def __init__(self, inner: Any, on_eof: Callable[[], None]) -> None:
        self._inner = inner
        self._on_eof = on_eof

    @property
    def last_context(self) -> Any:   # the dispatcher reads it by getattr, when the stream has one
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._on_eof()
            raise

    def __aiter__(self) -> _EofWatch:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _EofWatch:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._inner.__aexit__(*exc)  # type: ignore[no-any-return]


async def _list_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            return tools


# --- results and errors ------------------------------------------------------------------------


def _result_json(result: types.CallToolResult) -> dict[str, Any]:
    """A successful call's result as `McpSessions.call` documents it."""
    structured = result.structured_content
    if structured is not None:
        return dict(structured) if isinstance(structured, Mapping) else {"result": structured}
    match result.content:
        # A tool that returns a dict with no output schema (`-> dict`, or no annotation) is sent by
        # MCPServer as one text block of JSON and no structuredContent: it is that object again,
        # not escaped JSON text the model would have to read twice.
        case [types.TextContent(text=text)] if (found := _json_object(text)) is not None:
            return found
    return {"content": [_content_json(block) for block in result.content]}


def _json_object(text: str) -> dict[str, Any] | None:
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _content_json(block: types.ContentBlock) -> Any:
    if isinstance(block, types.TextContent):
        return block.text
    data = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("data", None)
    if isinstance(data.get("resource"), dict):
        data["resource"].pop("blob", None)
    return data


def _text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


class _SessionGone(Exception):
    """The server answered that it no longer knows the session: it ran nothing."""


def _session_gone(exc: Exception) -> bool:
    return isinstance(exc, MCPError) and (exc.code, exc.message) in _SESSION_GONE


def _closed(exc: Exception) -> bool:
    return isinstance(exc, MCPError) and exc.code == types.CONNECTION_CLOSED


def _unavailable(server: McpServerConfig, reason: str) -> str:
    return f"mcp server '{server.name}' is unavailable: {reason}"


def _describe(exc: BaseException) -> str:
    """One line for a failure: the first leaf of an exception group, an MCP error's own message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        # The SDK's own word for a closed connection; a server's -32000 (the same code) says its own.
        closed = (exc.code, exc.message) == (types.CONNECTION_CLOSED, "Connection closed")
        return "the connection closed" if closed else exc.message
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a start's failure as seen: every caller waiting on it may have been cancelled."""
    if not task.cancelled():
        task.exception()
