"""The MCP face (docs/design.md#mcp-face): external agents (Cursor, Claude, other agents) use one of
this gateway's agents' governed tools over MCP, at `/mcp` on the gateway's port, under the same
policy as the agent's own calls.

A thin shell. The `mcp` SDK speaks the protocol (its streamable-HTTP session manager, an ASGI app,
bridged onto the gateway's h11 exchange by gateway/asgi.py); gateway/mcp_catalog.py makes the tool
list; every call goes to the bound conversation through `Backend.external_call`, where the
conversation decides and runs it (actors/external_call.py). So the invoker bypasses nothing: gates,
mode, confirmation, the exploration budget, the tool pool, the log and its subscribers are the
conversation's own.

What happens here:
- admission as on `/ws` (gateway/server.py `admit`): the same tokens, Origin rules and 401/403;
- binding: the request that opens an MCP session names the caller's conversation
  (`?conversation_id=` or the `X-Reactgate-Conversation-Id` header), or a new one is opened
  (`?agent=` picks its agent) — through `Backend.open`, so ownership and the open-conversation quota
  are `/ws`'s; a foreign or unknown conversation is refused `403` before any session exists. Every
  later request of the session must carry the same owner's token;
- the access mode: the token's claim (`mcp_access_claim`), else the agent's `[mcp_face] access`;
  `?access=observe` may lower it, nothing raises it; the `initialize` result names it;
- `notifications/tools/list_changed`: while the session's standalone stream (its GET) is open, the
  conversation's log is watched as a subscriber watches it; when what the session may call differs
  from what it was last listed (a state transition, "Stop for now"), the client is told;
- a `confirm` call asks the client's user through `elicitation/create` when the client declared
  it, else the conversation asks its owner (the conversation decides which, `Approval`);
- `notifications/cancelled` cuts the call: the SDK cancels the handler, which cancels the call in
  the conversation, where it observes `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import parse_qs

import anyio
import msgspec
from mcp.server.context import CallNext, ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
)

from actors.external_call import (
    Access,
    ApprovalNeeded,
    ExternalCall,
    ExternalReply,
    ExternalView,
    Observed,
    Refused,
)
from actors.hosting.backend import Backend
from actors.identity import Caller, Owner
from actors.quotas import QuotaExceeded
from actors.turn_machine import APPROVAL_ANSWERS, APPROVAL_OPTIONS, Consent
from gateway.asgi import serve_asgi
from gateway.auth import Authenticated
from gateway.dispatch import Drain, quota_error, refusal
from gateway.front import HttpExchange, HttpRequest
from gateway.frontends import CONVERSATION_HEADER, STATUS, Gateway, retry_after
from gateway.mcp_catalog import SEARCH_TOOL, Listed, catalog_digest, listing, search
from protocol.events import ExternalClient, ToolResult, TurnCompleted
from protocol.frames import ErrorCode, ErrorFrame, Open, encode_frame

log = logging.getLogger("reactgate.gateway.mcp")

MCP_PATH: Final = "/mcp"
SCOPE_KEY: Final = "reactgate.mcp"        # the session's binding, in the ASGI scope the SDK hands back
CALL_ID_META: Final = "reactgate/call_id"  # a client's own call id: a retry with it is answered, never run twice
FACE: Final = "mcp"
SESSION_IDLE_S: Final = 30 * 60           # the SDK's default: a session nobody uses for this long ends
CORS_REQUEST_HEADERS: Final = ("Authorization", "Content-Type", "Accept", MCP_SESSION_ID_HEADER, "mcp-protocol-version",
                               "Last-Event-ID", CONVERSATION_HEADER, "traceparent", "tracestate")
APPROVAL_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"decision": {"type": "string", "title": "Decision", "enum": list(APPROVAL_OPTIONS)}},
    "required": ["decision"],
}


@dataclass(eq=False)
class Binding:
    """One MCP session: whose it is, the conversation it is bound to and its access mode, fixed when
    it opened; what it was last listed; and its SDK session, to tell it the list changed."""

    owner: Owner
    caller: Caller
    conversation_id: str
    access: Access
    session_id: str                  # the `turn_id` of the session's events in the conversation
    client: ExternalClient = field(default_factory=lambda: ExternalClient(FACE, "unknown"))
    listed: str | None = None        # the catalog digest of the last tools/list
    told: str | None = None          # the digest last announced with list_changed
    session: ServerSession | None = None
    watching: asyncio.Task[None] | None = None
    last_used: float = field(default_factory=time.monotonic)


class _FaceServer(Server[Any]):
    """The SDK's low-level server, announcing `tools.listChanged` (the face sends it)."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> InitializationOptions:
        return super().create_initialization_options(notification_options or NotificationOptions(tools_changed=True),
                                                     *args, **kwargs)


class McpFace:
    def __init__(self, server: Gateway) -> None:
        self._server = server
        self._bindings: dict[str, Binding] = {}   # MCP session id → binding
        self._mcp = _FaceServer("reactgate", on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        self._mcp.middleware.append(self._initialize)
        self._manager: StreamableHTTPSessionManager | None = None
        self._running: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._stop = asyncio.Event()

    @staticmethod
    def takes(path: str) -> bool:
        return path == MCP_PATH

    # -- the session manager's life: started with the first request, stopped with the gateway --------

    async def _ensure_running(self) -> StreamableHTTPSessionManager:
        if self._running is None:
            self._manager = StreamableHTTPSessionManager(self._mcp, session_idle_timeout=SESSION_IDLE_S)
            self._running = asyncio.get_running_loop().create_task(self._serve_sessions(self._manager))
        await self._started.wait()
        assert self._manager is not None
        return self._manager

    async def _serve_sessions(self, manager: StreamableHTTPSessionManager) -> None:
        async with manager.run():
            self._started.set()
            await self._stop.wait()

    async def close(self) -> None:
        """The gateway drains: every session ends (a client opens a new one on another replica)."""
        for binding in self._bindings.values():
            if binding.watching is not None:
                binding.watching.cancel()
        self._bindings.clear()
        self._stop.set()
        if self._running is not None:
            with contextlib.suppress(Exception):
                await self._running

    # -- HTTP: admission, binding, then the SDK ---------------------------------------------------

    async def handle(self, request: HttpRequest, exchange: HttpExchange) -> None:
        server = self._server
        if request.method == "OPTIONS":
            await self._preflight(request, exchange)
            return
        if not server.ready:
            await _plain(exchange, HTTPStatus.SERVICE_UNAVAILABLE, "draining: retry on another replica")
            return
        admitted = server.admit(request.headers, request.target)
        if not isinstance(admitted, Authenticated):
            await _plain(exchange, admitted.status, admitted.text.rstrip("\n"), admitted.headers)
            return
        manager = await self._ensure_running()
        sid = request.headers.get(MCP_SESSION_ID_HEADER)
        if sid is None:
            if request.method != "POST":
                await _plain(exchange, HTTPStatus.BAD_REQUEST, f"bad request: an MCP session opens with a POST {MCP_PATH}")
                return
            await self._open_session(manager, request, exchange, admitted)
            return
        binding = self._bindings.get(sid)
        if binding is not None:
            binding.last_used = time.monotonic()
        if binding is not None and binding.owner != admitted.owner:
            # Another caller's session: answered 404, as a session that does not exist.
            await _plain(exchange, HTTPStatus.NOT_FOUND, "Session not found")
            return
        if binding is not None and request.method == "GET":
            await self._stream(manager, request, exchange, binding)
            return
        await serve_asgi(manager.handle_request, request, exchange, {SCOPE_KEY: binding}, headers=_cors(request))
        if request.method == "DELETE" and binding is not None:
            self._unbind(sid)

    async def _open_session(self, manager: StreamableHTTPSessionManager, request: HttpRequest, exchange: HttpExchange,
                            admitted: Authenticated) -> None:
        """The request that opens a session: bind it to the caller's conversation, or refuse as /ws would."""
        self._forget_idle()
        query = parse_qs(request.query)
        named = request.headers.get(CONVERSATION_HEADER) or _last(query.get("conversation_id"))
        agent = _last(query.get("agent"))
        ceiling = self._claimed_access(admitted)
        lowered = _last(query.get("access"))
        if isinstance(ceiling, ErrorFrame) or (lowered is not None and lowered not in set(Access)):
            await self._refuse(exchange, ceiling if isinstance(ceiling, ErrorFrame) else ErrorFrame(
                code=ErrorCode.BAD_REQUEST, message=f"access must be one of {', '.join(Access)}"))
            return
        backend = self._server.backend
        frame = Open(id=f"mcp-{uuid.uuid4().hex[:8]}", conversation_id=named, agent=agent)
        try:
            opened = await backend.open(admitted.owner, named, agent, None)
            session_id = f"mcp-{uuid.uuid4().hex[:10]}"
            client = ExternalClient(FACE, "unknown")
            view = await backend.external_view(admitted.owner, opened.conversation_id, session_id, client, ceiling)
        except Exception as exc:
            answer = refusal(exc, frame)
            if isinstance(answer, Drain):
                self._server.drain_soon()
                await _plain(exchange, HTTPStatus.SERVICE_UNAVAILABLE, "draining: retry on another replica")
                return
            await self._refuse(exchange, answer)
            return
        access = _lower(view.access, Access(lowered) if lowered is not None else None)
        binding = Binding(admitted.owner, admitted.tool_caller(self._server.settings.tool_claims),
                          opened.conversation_id, access, session_id, client)

        def learn_session(status: int, headers: list[tuple[bytes, bytes]]) -> None:
            for key, value in headers:
                if key.lower() == MCP_SESSION_ID_HEADER.encode() and status < 400:
                    self._bindings[value.decode("latin-1")] = binding

        await serve_asgi(manager.handle_request, request, exchange, {SCOPE_KEY: binding}, on_start=learn_session,
                         headers=_cors(request))

    def _claimed_access(self, admitted: Authenticated) -> Access | ErrorFrame | None:
        """The token's access claim (None: none, the agent's profile decides); an unknown value refuses."""
        claim = self._server.settings.mcp_access_claim
        value = admitted.claims.get(claim)
        if value is None:
            return None
        if value not in set(Access):
            return ErrorFrame(code=ErrorCode.FORBIDDEN, message=f"forbidden: the token's {claim!r} claim must be one of "
                                                                f"{', '.join(Access)}")
        return Access(value)

    async def _stream(self, manager: StreamableHTTPSessionManager, request: HttpRequest, exchange: HttpExchange,
                      binding: Binding) -> None:
        """The session's standalone stream (GET): counted against the connection quotas as a
        WebSocket is; while it is open, the conversation's log is watched for list changes."""
        address = exchange.transport.get_extra_info("peername") if exchange.transport else None
        held = self._server.hold_connection(str(address[0]) if address else "", binding.owner)
        if isinstance(held, QuotaExceeded):
            await self._refuse(exchange, quota_error(held))
            return

        def started(status: int, headers: list[tuple[bytes, bytes]]) -> None:
            # Started once the SDK answers: the stream it writes notifications to exists by the time
            # the watcher's first look (behind a backend call) can send one.
            if status == HTTPStatus.OK and binding.watching is None:
                binding.watching = asyncio.get_running_loop().create_task(self._watch(binding))

        try:
            await serve_asgi(manager.handle_request, request, exchange, {SCOPE_KEY: binding}, on_start=started,
                             headers=_cors(request))
        finally:
            self._server.release_connection(held)
            if binding.watching is not None:
                binding.watching.cancel()
                binding.watching = None

    async def _preflight(self, request: HttpRequest, exchange: HttpExchange) -> None:
        """CORS preflight of a browser page (an MCP client in a web app) from an origin that may
        connect, as the frontends answer theirs; no token is asked (browsers send none)."""
        origins = request.headers.get_all("Origin")
        if not origins or not self._server.origin_allowed(origins, request.headers.get("Host")):
            await _plain(exchange, HTTPStatus.FORBIDDEN, "forbidden: origin not allowed")
            return
        await exchange.respond(HTTPStatus.NO_CONTENT, b"", "text/plain", [
            *_cors(request), ("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
            ("Access-Control-Allow-Headers", ", ".join(CORS_REQUEST_HEADERS)), ("Access-Control-Max-Age", "600")])

    def _forget_idle(self) -> None:
        """Bindings of sessions the SDK has ended for idleness (the same timeout, no stream open): the
        bindings held are those of the sessions in use, not of every session ever opened."""
        now = time.monotonic()
        for sid, binding in list(self._bindings.items()):
            if binding.watching is None and now - binding.last_used > SESSION_IDLE_S:
                self._unbind(sid)

    def _unbind(self, sid: str) -> None:
        binding = self._bindings.pop(sid, None)
        if binding is not None and binding.watching is not None:
            binding.watching.cancel()

    async def _refuse(self, exchange: HttpExchange, frame: ErrorFrame) -> None:
        """A request refused before any session exists: the error frame /ws would send, with the
        frontends' HTTP status (docs/frontends.md#tokens-origins-refusals)."""
        status = STATUS.get(frame.code, HTTPStatus.INTERNAL_SERVER_ERROR)
        await exchange.respond(status, encode_frame(frame), "application/json", retry_after(frame))

    # -- list_changed: the log, watched while the session's stream is open --------------------------

    async def _watch(self, binding: Binding) -> None:
        backend = self._server.backend
        try:
            await self._tell_if_changed(binding)
            subscription = backend.subscribe(binding.owner, binding.conversation_id, await _head(backend, binding))
            async with contextlib.aclosing(subscription):  # type: ignore[type-var]
                async for batch in subscription:
                    # What a session may call changes with a tool's result (a state transition, the
                    # budget question's answer) or at a turn's end (a new turn's budget).
                    if any(isinstance(e.data, ToolResult | TurnCompleted) for e in batch):
                        await self._tell_if_changed(binding)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("watching conversation %s for the MCP session %s failed", binding.conversation_id,
                        binding.session_id, exc_info=True)

    async def _tell_if_changed(self, binding: Binding) -> None:
        if binding.listed is None or binding.session is None or binding.watching is None:
            # Nothing listed yet (the first tools/list is news enough), or no stream open to carry the
            # notification: the watch's first look, once the client opens one, tells it then.
            return
        view = await self._view(binding)
        digest = catalog_digest(view)
        if digest != binding.listed and digest != binding.told:
            binding.told = digest
            await binding.session.send_tool_list_changed()

    # -- the SDK's handlers -----------------------------------------------------------------------

    async def _initialize(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        """`initialize`: the client's name (its calls are attributed to it) and, in the result, the
        bound conversation and the access mode."""
        result = await call_next(ctx)
        if ctx.method != "initialize" or not isinstance(result, dict):
            return result
        binding = _binding_of(ctx)
        if binding is None:
            return result
        info = (ctx.params or {}).get("clientInfo") or {}
        binding.client = ExternalClient(FACE, str(info.get("name") or "unknown")[:200])
        binding.session = ctx.session
        mode = "ask mode: write tools are absent" if binding.access is Access.OBSERVE else "agent mode"
        result["instructions"] = (f"reactgate conversation {binding.conversation_id}; access {binding.access} ({mode}). "
                                  "Every call is governed and logged in the conversation.")
        result["_meta"] = {**(result.get("_meta") or {}), "reactgate/conversation_id": binding.conversation_id,
                           "reactgate/access": str(binding.access)}
        return result

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any], params: PaginatedRequestParams | None) -> ListToolsResult:
        binding = _bound(ctx)
        binding.session = ctx.session
        listed: Listed = listing(await self._view(binding))
        binding.listed, binding.told = listed.digest, None
        return ListToolsResult(tools=[Tool.model_validate(t) for t in listed.tools])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams) -> CallToolResult:
        binding = _bound(ctx)
        binding.session = ctx.session
        arguments = dict(params.arguments or {})
        if params.name == SEARCH_TOOL:
            found = search(await self._view(binding), str(arguments.get("query", "")))
            return _result({"capabilities": found}, error=False)
        own = (ctx.meta or {}).get(CALL_ID_META) if isinstance(ctx.meta, Mapping) else None
        digest = hashlib.sha256(str(own).encode()).hexdigest()[:16]   # an idempotency key of the conversation
        call_id = f"{FACE}.{digest}" if own is not None else f"{binding.session_id}.{ctx.request_id}"
        capabilities = ctx.session.client_capabilities
        call = ExternalCall(session_id=binding.session_id, client=binding.client, access=binding.access, call_id=call_id,
                            tool_id=params.name, params=arguments, caller=binding.caller,
                            elicit=capabilities is not None and capabilities.elicitation is not None)
        reply = await self._run(binding, call)
        if isinstance(reply, ApprovalNeeded):
            reply = await self._run(binding, _with_consent(call, await _elicit(ctx, reply)))
        await self._tell_if_changed(binding)
        return _reply(reply)

    async def _run(self, binding: Binding, call: ExternalCall) -> ExternalReply:
        """The call in its conversation. A cancelled handler (the client's `notifications/cancelled`)
        cancels the call there, where it observes `cancelled`."""
        backend = self._server.backend
        try:
            return await backend.external_call(binding.owner, binding.conversation_id, call)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await backend.external_cancel(binding.owner, binding.conversation_id, call.call_id)
            raise

    async def _view(self, binding: Binding) -> ExternalView:
        return await self._server.backend.external_view(binding.owner, binding.conversation_id, binding.session_id,
                                                        binding.client, binding.access)


def _with_consent(call: ExternalCall, consent: Consent) -> ExternalCall:
    return msgspec.structs.replace(call, consent=consent.value, elicit=False)


async def _elicit(ctx: ServerRequestContext[Any, Any], needed: ApprovalNeeded) -> Consent:
    """The client's user decides, through `elicitation/create`: an offered option, else a denial."""
    text = f"{needed.question} Params: {msgspec.json.encode(needed.params).decode()}"
    try:
        answer = await ctx.session.elicit_form(text, dict(APPROVAL_SCHEMA),  # type: ignore[arg-type]
                                               related_request_id=ctx.request_id)
    except Exception:
        log.info("elicitation failed: the call is denied", exc_info=True)
        return Consent.DENIED
    if answer.action != "accept" or not answer.content:
        return Consent.DENIED
    return APPROVAL_ANSWERS.get(str(answer.content.get("decision")), Consent.DENIED)


def _reply(reply: ExternalReply) -> CallToolResult:
    """A refusal is a tool error whose text is the notice the model would read (`[notice] …`); an
    observation is the result (an error observation, as the model reads it, is a tool error too)."""
    if isinstance(reply, Refused):
        return _result(reply.notice.to_dict(), error=True)
    assert isinstance(reply, Observed), reply
    return _result(reply.payload(), error=not reply.ok)


def _result(payload: dict[str, Any], *, error: bool) -> CallToolResult:
    text = msgspec.json.encode(payload).decode()
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=None if error else payload, is_error=error)


def _binding_of(ctx: ServerRequestContext[Any, Any]) -> Binding | None:
    request = ctx.request
    scope = getattr(request, "scope", None)
    binding = scope.get(SCOPE_KEY) if isinstance(scope, Mapping) else None
    return binding if isinstance(binding, Binding) else None


def _bound(ctx: ServerRequestContext[Any, Any]) -> Binding:
    binding = _binding_of(ctx)
    if binding is None:  # every request of a session reaches here through `handle`, which binds it
        raise RuntimeError("an MCP request without its session's binding")
    return binding


async def _head(backend: Backend, binding: Binding) -> int:
    """The conversation's last seq now: the watch starts there."""
    opened = await backend.open(binding.owner, binding.conversation_id, None, None)
    return opened.last_seq


def _cors(request: HttpRequest) -> list[tuple[str, str]]:
    """A page of another origin got here only if that origin may connect (`admit`): it may read the
    session id and the conversation's id."""
    origins = request.headers.get_all("Origin")
    if len(origins) != 1:
        return []
    return [("Access-Control-Allow-Origin", origins[0]), ("Vary", "Origin"),
            ("Access-Control-Expose-Headers", f"{MCP_SESSION_ID_HEADER}, {CONVERSATION_HEADER}")]


def _lower(ceiling: Access, asked: Access | None) -> Access:
    """A client may ask for less than its ceiling, never more."""
    return Access.OBSERVE if Access.OBSERVE in (ceiling, asked) else ceiling


def _last(values: list[str] | None) -> str | None:
    return values[-1] if values else None


async def _plain(exchange: HttpExchange, status: HTTPStatus, text: str, headers: Sequence[tuple[str, str]] = ()) -> None:
    await exchange.respond(status, (text + "\n").encode(), "text/plain; charset=utf-8", headers)
