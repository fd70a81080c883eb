"""The gateway: WebSocket `reactgate.v1` at /ws plus plain HTTP on the same port (docs/wire-protocol.md).

A thin shell over the hosting interface (`actors.hosting.backend.Backend`): it authenticates the
handshake, decodes frames (`protocol.frames`), applies the per-connection limits, hands each
frame to `gateway.dispatch` (its backend call and reply, or the error frame its refusal is), and
everything it sends to the connection's `Session` queue.

Refusals, by where they happen:
- handshake: wrong path → HTTP 404; a browser page from an origin not allowed → HTTP 403
  (gateway/origins.py); bad/expired/missing JWT → HTTP 401 (no WebSocket, so no `unauthorized`
  frame); missing or other subprotocol → HTTP 400 (websockets' negotiation); draining → HTTP 503;
  a replica that is late (its loop, its deliveries) → HTTP 503 with Retry-After (gateway/overload.py),
  before the token check.
- the token's `exp` → close 4001 (`token expired`): the client reconnects with a fresh token.
- after the handshake: max connections → close 1013; a connection quota (per client address, per
  user: docs/design.md#quotas) → an `error quota_exceeded` frame, then close 1013; frame over
  max_frame_bytes → close 1009 (websockets' `max_size`); `bad_frames_before_close` bad frames in a
  row → close 1008; drain → close 1012.
- everything else is an `error` frame and the connection stays open (gateway/dispatch.py's
  `REFUSALS`). Choices this gateway makes (docs/wire-protocol.md#14-details-worth-knowing):
  subscribing to more than `max_conversations_per_connection` conversations is `overloaded` (a
  resource limit, like rate_limited — not a malformed frame); a client that keeps sending but
  never reads its replies is closed with 1008 once its send queue is full even of control frames.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import mimetypes
import re
import signal
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import parse_qs

import msgspec
from opentelemetry.context import Context
from prometheus_client import CONTENT_TYPE_LATEST
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from actors import heap, tracing
from actors.hosting.backend import Backend, ConfigurationReplaced
from actors.identity import Owner
from actors.quotas import QuotaExceeded, Scope, connection_refusal, scope_key
from actors.store.base import StoreUnavailable
from gateway.auth import Authenticated, Unauthorized, authenticate, load_verifier
from gateway.dispatch import dispatch, quota_error, safe_cause, unavailable_error
from gateway.front import HttpExchange, HttpFront, HttpRequest, Refused, front_connection
from gateway.frontends import Frontends, retry_after
from gateway.limits import quota_limits, session_limits
from gateway.mcp_face import McpFace
from gateway.metrics import GatewayMetrics
from gateway.origins import OriginPolicy
from gateway.overload import PROBE_S, RETRY_AFTER_S, Overload
from gateway.session import Session, WebSocketSink
from gateway.settings import Settings, check_bind
from protocol.frames import (
    LIST_LIMIT_MAX,
    SUBPROTOCOL,
    WS_PATH,
    CloseCode,
    ErrorCode,
    FrameError,
    InvalidCursor,
    decode_client_frame,
    encode_frame,
    recover_id,
)

log = logging.getLogger("reactgate.gateway")


class _ConnectionLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """websockets logs every connection's open and close at INFO: 18,000 lines for 9,000 idle
    clients. Here they are DEBUG; /metrics counts connections (reactgate_connections*)."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        super().log(logging.DEBUG if level == logging.INFO else level, msg, *args, **kwargs)

STATIC_DIR = Path(__file__).with_name("static")
_STATIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Where the platform's table says otherwise (`.ts` is a Qt translation file to it): reactgate.d.ts.
STATIC_TYPES: Final[Mapping[str, str]] = {".js": "text/javascript", ".ts": "text/plain; charset=utf-8"}
PLACEHOLDER_PAGE = (
    b"<!doctype html><meta charset=utf-8><title>reactgate</title>"
    b"<h1>reactgate</h1><p>WebSocket endpoint: <code>/ws</code> (subprotocol <code>reactgate.v1</code>). "
    b"Health: <a href=/healthz>/healthz</a> <a href=/readyz>/readyz</a> <a href=/metrics>/metrics</a>.</p>"
)
BINARY_MESSAGE = "binary frames are not accepted: send JSON text frames"
LIST_LIMIT_DEFAULT: Final = 20   # GET /v1/conversations without ?limit= (docs/wire-protocol.md#get-v1conversations)
_json: Final = msgspec.json.Encoder()


# -- the store's health, as the backend may report it (docs/design.md#store-outage) -----------------
#
# Optional on a Backend, so asked with getattr: a backend without them has no store metrics and a
# /readyz that does not look at the store.
#   store_health()   → StoreHealth                 (or an awaitable of it)
#   store_counters() → Mapping[str, int | float]   (or an awaitable of it): the store's own totals,
#                      e.g. {"retried_batches": 3}, each shown as reactgate_store_<name>_total

# The kernel's queue of connections not yet accepted (asyncio's default: 100). When it is full the
# kernel drops what arrives (`nstat` ListenOverflows); the client sees its handshake time out or its
# socket reset, never a 503 (docs/design.md#overload). 1,000 clients starting within 5 s overflowed 100
# by ~6,000 drops (bench/peer_bench.py, one pinned core). As uvicorn's and gunicorn's default; the
# kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG: Final = 2048
STORE_POLL_S: Final = 2.0         # how often the gateway looks at the store (/metrics' outage seconds)
STORE_ASK_TIMEOUT_S: Final = 1.0  # a look that takes longer tells nothing (and holds up no probe)


class StoreHealth(Protocol):
    """What `store_health()` returns."""

    @property
    def ok(self) -> bool: ...            # the store takes calls now
    @property
    def since(self) -> float | None: ... # not ok: when the outage began (unix time, time.time())
    @property
    def cause(self) -> str | None: ...   # not ok: why, in words fit for a client (StoreUnavailable.cause)


@dataclass(frozen=True)
class StoreDown:
    """A `store_health()` that raised StoreUnavailable instead of answering: the store is down."""

    cause: str
    since: float | None = None
    ok: bool = False


async def _ask(backend: object, method: str) -> Any:
    """`backend.<method>()`, awaited if it is a coroutine, within STORE_ASK_TIMEOUT_S; None when the
    backend has no such method or asking failed (logged: a look that fails is no outage)."""
    ask = getattr(backend, method, None)
    if ask is None:
        return None
    try:
        answer = ask()
        if inspect.isawaitable(answer):
            answer = await asyncio.wait_for(answer, STORE_ASK_TIMEOUT_S)
    except StoreUnavailable as exc:
        return StoreDown(exc.cause) if method == "store_health" else None
    except Exception:
        log.warning("asking the backend's %s failed", method, exc_info=True)
        return None
    return answer


async def store_health(backend: object) -> StoreHealth | None:
    """The store's health by the backend's `store_health()`, or None: no such method, or no answer."""
    health: StoreHealth | None = await _ask(backend, "store_health")
    return health


async def store_counters(backend: object) -> Mapping[str, float] | None:
    """The store's counters by the backend's `store_counters()`, or None: no such method, or no answer."""
    counters = await _ask(backend, "store_counters")
    if counters is not None and not isinstance(counters, Mapping):
        log.warning("the backend's store_counters gave %s, not a mapping: ignored", type(counters).__name__)
        return None
    return counters


def store_down_text(health: StoreHealth, now: float) -> str:
    """/readyz's reason for a store that is down: `store unavailable since 12.5s: failover`."""
    since = "" if health.since is None else f" since {max(0.0, now - health.since):.1f}s"
    return f"store unavailable{since}: {safe_cause(health.cause or '')}"


class GatewayServer:
    """`await start()` → (host, port); `await serve_forever()`; `await drain()` on SIGTERM."""

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = GatewayMetrics()
        self.sessions: set[Session] = set()
        self.metrics.track(lambda: len(self.sessions), lambda: sum(s.queue_depth for s in self.sessions))
        # Refuses to construct with auth settings that cannot work (AuthConfigError, OriginConfigError).
        self._verifier = load_verifier(settings)
        self._origins = OriginPolicy.from_settings(settings)
        self._callers: weakref.WeakKeyDictionary[ServerConnection, Authenticated] = weakref.WeakKeyDictionary()
        self._server: Server | None = None
        self._backend_started = False
        self._draining = False
        self._replaced: ConfigurationReplaced | None = None  # a newer configuration generation took over
        self._drain_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        # Read once, here: each connection's limits, and the connection quotas (this replica's own
        # sockets, by client address and by user).
        self._session_limits = session_limits(settings)
        self._quotas = quota_limits(settings)
        self._connections: collections.Counter[tuple[Scope, str]] = collections.Counter()
        self._quota_metrics: asyncio.Task[None] | None = None
        self._store_watch: asyncio.Task[None] | None = None
        # Load shedding (docs/design.md#overload): new clients are refused while this replica is late.
        self.overload = Overload(settings.overload_lag_ms / 1000, settings.overload_delivery_ms / 1000)
        self.metrics.track_overload(self.overload)
        self._probe: asyncio.Task[None] | None = None
        # The frontends' endpoints (docs/frontends.md): requests with a body and a streamed answer,
        # split from the WebSocket's by gateway/front.py on the same port.
        self.frontends = Frontends(self)
        # The MCP face (docs/design.md#mcp-face): /mcp on the same port, through the same exchange.
        self.mcp = McpFace(self)
        self._front = HttpFront(self._takes_http, self._handle_http, settings.max_frame_bytes)

    def _takes_http(self, method: str, path: str) -> bool:
        return self.mcp.takes(path) or self.frontends.takes(method, path)

    async def _handle_http(self, request: HttpRequest, exchange: HttpExchange) -> None:
        if self.mcp.takes(request.path):
            await self.mcp.handle(request, exchange)
        else:
            await self.frontends.handle(request, exchange)

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._backend_started and not self._draining

    async def start(self) -> tuple[str, int]:
        check_bind(self.settings)
        self.backend.on_replaced = self._on_replaced
        await self.backend.start()
        self._backend_started = True
        heap.settle()   # what is loaded by now lives as long as the process (actors/heap.py)
        self.metrics.config.info({"generation": self.backend.generation or "local"})
        try:
            self._server = await serve(
                self._handle_connection,
                self.settings.host,
                self.settings.port,
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                process_request=self._process_request,
                max_size=self.settings.max_frame_bytes,
                compression="deflate" if self.settings.compression else None,
                logger=_ConnectionLog(logging.getLogger("reactgate.gateway.connections")),
                create_connection=front_connection(self._front),
                backlog=LISTEN_BACKLOG,
            )
        except BaseException:
            self._backend_started = False
            await self.backend.stop()
            raise
        host, port = self._server.sockets[0].getsockname()[:2]
        self._quota_metrics = asyncio.get_running_loop().create_task(self._read_quota_counters())
        self._probe = asyncio.get_running_loop().create_task(self._probe_loop())
        if any(hasattr(self.backend, method) for method in ("store_health", "store_counters")):
            self._store_watch = asyncio.get_running_loop().create_task(self._watch_store())
        log.info("reactgate gateway listening on %s:%s", host, port)
        return str(host), int(port)

    async def _read_quota_counters(self) -> None:
        """The store's tenant quota counters into /metrics, every `quota_metrics_interval_s`."""
        while True:
            try:
                self.metrics.set_quota_usage(await self.backend.quota_usage())
            except Exception:
                log.warning("reading the quota counters failed", exc_info=True)
            await asyncio.sleep(self.settings.quota_metrics_interval_s)

    async def _probe_loop(self) -> None:
        """How late a timer of this loop fires, every PROBE_S, into `self.overload` (gateway/overload.py).
        By the process's clock: uvloop's `loop.time()` is read once per loop iteration, so it would
        not count the iteration the timer waited through."""
        while True:
            due = time.monotonic() + PROBE_S
            await asyncio.sleep(PROBE_S)
            self.overload.probe(time.monotonic() - due)

    async def _watch_store(self) -> None:
        """Look at the store every STORE_POLL_S, so that /metrics counts an outage nobody probed."""
        while True:
            try:
                await self.refresh_store()
            except Exception:
                log.warning("looking at the store failed", exc_info=True)
            await asyncio.sleep(STORE_POLL_S)

    async def refresh_store(self) -> StoreHealth | None:
        """Ask the backend for the store's health and counters, into /metrics; the health, or None
        when the backend cannot tell."""
        health = await store_health(self.backend)
        if health is not None:
            self.metrics.store.observe(bool(health.ok), time.monotonic())
        counters = await store_counters(self.backend)
        if counters is not None:
            self.metrics.store.set_counters(counters)
        return health

    async def serve_forever(self) -> None:
        """Return once `drain()` finished (or the server was closed)."""
        await self._stopped.wait()

    def _on_replaced(self, replaced: ConfigurationReplaced) -> None:
        """A newer configuration generation is current (docs/design.md#generations): this replica must
        not serve any more. It drains as on SIGTERM: its clients resume on a current replica."""
        self._replaced = replaced
        self.drain_soon()

    def drain_soon(self) -> None:
        """Signal-handler friendly: start draining once."""
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self.drain())

    async def drain(self) -> None:
        """SIGTERM: stop accepting, flush every queue, close clients with 1012, stop the backend,
        all within `drain_grace_s`. Clients resume on another replica with their last seq."""
        if self._draining:
            await self._stopped.wait()
            return
        self._draining = True
        for task in (self._quota_metrics, self._store_watch, self._probe):
            if task is not None:
                task.cancel()
        deadline = time.monotonic() + self.settings.drain_grace_s
        server = self._server
        try:
            if server is not None:
                server.server.close()  # stop listening; handshakes in flight get 503
                sessions = list(self.sessions)
                for session in sessions:
                    session.pause_all()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.gather(*(s.flushed() for s in sessions)), self._left(deadline, 0.5)
                    )
                await self.mcp.close()    # MCP sessions end: a client opens one on another replica
                self._front.close_all()  # a frontend's stream: its client resumes on another replica
                server.close(code=CloseCode.SERVICE_RESTART, reason="server draining")
                try:
                    await asyncio.wait_for(server.wait_closed(), self._left(deadline, 0.25))
                except TimeoutError:
                    log.warning("drain: aborting %d connections that did not close", len(server.connections))
                    for connection in list(server.all_connections):
                        connection.transport.abort()
            if self._backend_started:
                try:
                    await asyncio.wait_for(self.backend.stop(), max(0.1, deadline - time.monotonic()))
                except TimeoutError:
                    log.warning("drain: the backend did not stop within the grace period")
                self._backend_started = False
        finally:
            self._stopped.set()

    @staticmethod
    def _left(deadline: float, share: float) -> float:
        return max(0.0, (deadline - time.monotonic()) * share)

    # -- HTTP on the same port: routed by `ROUTES` (below the class) ---------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | Awaitable[Response] | None:
        """Every request, before any WebSocket: its route's response (awaited by websockets when the
        route reads the store), or None to go on with the WebSocket handshake."""
        return route(_path(request))(self, connection, request)

    def _healthz(self, connection: ServerConnection, request: Request) -> Response:
        return connection.respond(HTTPStatus.OK, "ok\n")

    async def _readyz(self, connection: ServerConnection, request: Request) -> Response:
        """503 while this replica must not get new clients: a load balancer stops sending them. A
        store that is down is such a time (no new conversation could be opened); the WebSockets
        already open are kept, and their frames are answered `unavailable` until it is back."""
        if self.ready:
            health = await self.refresh_store()
            if health is None or health.ok:
                return connection.respond(HTTPStatus.OK, f"ready (generation {self.backend.generation or 'local'})\n")
            why = store_down_text(health, time.time())
        else:
            why = "draining" if self._draining else "backend not started"
            if self._replaced is not None:
                why = f"draining: {self._replaced}"
        return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {why}\n")

    async def _metrics_page(self, connection: ServerConnection, request: Request) -> Response:
        if self._backend_started:
            await self.refresh_store()  # the store's gauge as of this scrape
        return _response(HTTPStatus.OK, self.metrics.render(), CONTENT_TYPE_LATEST)

    def _console(self, connection: ServerConnection, request: Request) -> Response:
        index = STATIC_DIR / "index.html"
        body = index.read_bytes() if index.is_file() else PLACEHOLDER_PAGE
        return _response(HTTPStatus.OK, body, "text/html; charset=utf-8")

    def _static(self, connection: ServerConnection, request: Request) -> Response:
        # One plain file name: no path, so nothing outside STATIC_DIR is ever served.
        name = _path(request).removeprefix("/static/")
        if not _STATIC_NAME.match(name) or not (file := STATIC_DIR / name).is_file():
            return connection.respond(HTTPStatus.NOT_FOUND, "not found\n")
        content_type = STATIC_TYPES.get(file.suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
        return _response(HTTPStatus.OK, file.read_bytes(), content_type)

    def _not_found(self, connection: ServerConnection, request: Request) -> Response:
        return connection.respond(HTTPStatus.NOT_FOUND, f"not found: the WebSocket endpoint is {WS_PATH}\n")

    def _handshake(self, connection: ServerConnection, request: Request) -> Response | None:
        """The WebSocket path: refused while draining (503), from a browser origin not allowed (403)
        or without a valid token (401), before any WebSocket exists (docs/wire-protocol.md#a-refused-handshake).
        Else the caller is kept for `_handle_connection` and the handshake goes on (subprotocol negotiation)."""
        if self._draining:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "draining: reconnect to another replica\n")
        caller = self._caller(connection, request)
        if isinstance(caller, Response):
            return caller
        self._callers[connection] = caller
        return None

    def _caller(self, connection: ServerConnection, request: Request) -> Authenticated | Response:
        """Who is asking (`admit`), or the handshake's refusal as websockets' response."""
        admitted = self.admit(request.headers, request.path)
        if isinstance(admitted, Refused):
            response = connection.respond(admitted.status, admitted.text)
            response.headers.update(admitted.headers)
            return response
        return admitted

    def origin_allowed(self, origins: list[str], host: str | None) -> bool:
        return self._origins.allows(origins, host)

    def trace_of(self, headers: Headers) -> Context | None:
        return trace_parent(headers)

    def admit(self, headers: Headers, target: str) -> Authenticated | Refused:
        """Who is asking, by the handshake's rules, for /ws, the JSON endpoints behind a token
        (docs/wire-protocol.md#16-agents-and-the-conversation-list) and the frontends' endpoints
        (docs/frontends.md): 503 while this replica is late (gateway/overload.py: before any
        work, the token's check included), 403 for a browser page from an origin not allowed, 401
        without a valid token."""
        if self.overload.overloaded:
            self.metrics.connections_refused.labels("overloaded").inc()
            return Refused(HTTPStatus.SERVICE_UNAVAILABLE, self.overload.refusal(), (("Retry-After", str(RETRY_AFTER_S)),))
        path, _, query = target.partition("?")
        origins = headers.get_all("Origin")
        if not self._origins.allows(origins, headers.get("Host")):
            self.metrics.connections_refused.labels("origin").inc()
            # the Origin only (the client's choice, repr-escaped and cut short), never a token
            what = "a WebSocket handshake" if path == WS_PATH else f"a request for {path}"  # a ROUTES key
            log.warning("refused %s from origin %.200r", what, ", ".join(origins))
            return Refused(HTTPStatus.FORBIDDEN, "forbidden: origin not allowed\n")
        try:
            return authenticate(headers, query, self._verifier)
        except Unauthorized as exc:
            self.metrics.connections_refused.labels("unauthorized").inc()
            return Refused(HTTPStatus.UNAUTHORIZED, f"unauthorized: {exc}\n")

    def _agents(self, connection: ServerConnection, request: Request) -> Response:
        """The agents served and the default one (docs/wire-protocol.md#get-agents)."""
        caller = self._caller(connection, request)
        if isinstance(caller, Response):
            return caller
        return _json_response(request, _json.encode(self.backend.agents()))

    async def _conversations(self, connection: ServerConnection, request: Request) -> Response:
        """A page of the caller's own conversations (docs/wire-protocol.md#get-v1conversations)."""
        caller = self._caller(connection, request)
        if isinstance(caller, Response):
            return caller
        if not self._backend_started:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: backend not started\n")
        query = parse_qs(request.path.partition("?")[2])
        limits, befores = query.get("limit", [str(LIST_LIMIT_DEFAULT)]), query.get("before")
        limit = int(limits[-1]) if limits[-1].isdecimal() else 0
        if not 1 <= limit <= LIST_LIMIT_MAX:
            return connection.respond(HTTPStatus.BAD_REQUEST,
                                      f"bad request: limit must be an integer from 1 to {LIST_LIMIT_MAX}\n")
        try:
            page = await self.backend.list_conversations(caller.owner, limit, befores[-1] if befores else None)
        except InvalidCursor as exc:
            return connection.respond(HTTPStatus.BAD_REQUEST, f"bad request: {exc}\n")
        except StoreUnavailable as exc:  # as /ws's `unavailable`: ask again after Retry-After
            refused = unavailable_error(exc)
            text = f"store unavailable: {safe_cause(exc.cause)}; retry after {refused.retry_after_ms} ms\n"
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, text.encode(), "text/plain; charset=utf-8",
                             retry_after(refused))
        except Exception:
            ref = uuid.uuid4().hex[:12]  # as an `internal` error frame: the details only in the log
            log.exception("listing conversations failed (ref %s)", ref)
            return connection.respond(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error (ref {ref})\n")
        return _json_response(request, _json.encode(page))

    # -- WebSocket ----------------------------------------------------------------------------

    async def _handle_connection(self, ws: ServerConnection) -> None:
        caller = self._callers.pop(ws, None)
        if caller is None:  # process_request always sets it; never serve an unauthenticated socket
            await ws.close(CloseCode.POLICY_VIOLATION, "unauthenticated")
            return
        if len(self.sessions) >= self.settings.max_connections:
            self.metrics.connections_refused.labels("max_connections").inc()
            with contextlib.suppress(ConnectionClosed):
                await ws.close(CloseCode.TRY_AGAIN_LATER, "overloaded: max connections reached, retry later")
            return
        held = self.hold_connection(str(ws.remote_address[0]) if ws.remote_address else "", caller.owner)
        if isinstance(held, QuotaExceeded):
            await self._refuse_connection(ws, caller.owner.tenant, held)
            return
        session = Session(WebSocketSink(ws), caller.owner, self.backend, self._session_limits, self.metrics, expires_at=caller.expires_at,
                          trace_parent=_upgrade_trace(ws.request), caller=caller.tool_caller(self.settings.tool_claims),
                          overload=self.overload)
        self.sessions.add(session)
        self.metrics.connections_total.inc()
        try:
            await self._read_loop(ws, session)
        except ConnectionClosed:
            pass
        finally:
            self.sessions.discard(session)
            self.release_connection(held)
            await session.aclose()

    def hold_connection(self, address: str, owner: Owner) -> tuple[tuple[Scope, str], ...] | QuotaExceeded:
        """Count one more connection of this client address and user against the connection quotas
        (docs/design.md#quotas): a WebSocket, or a frontend's open event stream (docs/frontends.md).
        The keys to `release_connection`, or the quota it would break (nothing counted)."""
        held = ((Scope.IP, address), (Scope.USER, scope_key(Scope.USER, owner)))
        refused = connection_refusal(self._quotas, *(self._connections[key] for key in held))
        if refused is not None:
            return refused
        self._connections.update(held)
        return held

    def release_connection(self, held: tuple[tuple[Scope, str], ...]) -> None:
        self._connections.subtract(held)
        for key in held:
            if self._connections[key] <= 0:
                del self._connections[key]

    async def _refuse_connection(self, ws: ServerConnection, tenant: str, refused: QuotaExceeded) -> None:
        """Over a connection quota: the client learns which one, then the connection closes like one
        over max connections (1013: retry later)."""
        self.metrics.connections_refused.labels(f"quota_{refused.quota}_{refused.scope}").inc()
        self.metrics.quota_refused.labels(tenant, refused.quota.value, refused.scope.value).inc()
        self.metrics.errors.labels(ErrorCode.QUOTA_EXCEEDED.value).inc()
        with contextlib.suppress(ConnectionClosed):
            await ws.send(encode_frame(quota_error(refused)), text=True)
            await ws.close(CloseCode.TRY_AGAIN_LATER, refused.message[:120])

    async def _read_loop(self, ws: ServerConnection, session: Session) -> None:
        while True:
            if session.queue_depth:
                # recv() returns buffered frames without yielding: let the writer hand the replies
                # to the socket first, so a pipelining client is not mistaken for a slow one
                await asyncio.sleep(0)
            message = await ws.recv()
            if not session.bucket.take():
                frame_id = recover_id(message) if isinstance(message, str) else None
                session.error(ErrorCode.RATE_LIMITED, "rate limit exceeded: frame not processed", frame_id)
                continue
            if isinstance(message, bytes):
                self.metrics.frames_in.labels("binary").inc()
                if await self._bad_frame(ws, session, FrameError(ErrorCode.BAD_REQUEST, BINARY_MESSAGE)):
                    return
                continue
            try:
                frame = decode_client_frame(message)
            except FrameError as exc:
                self.metrics.frames_in.labels("invalid").inc()
                if await self._bad_frame(ws, session, exc):
                    return
                continue
            session.bad_frames.good()
            self.metrics.frames_in.labels(type(frame).__struct_config__.tag).inc()
            await dispatch(frame, session, self.backend, self.drain_soon)

    async def _bad_frame(self, ws: ServerConnection, session: Session, exc: FrameError) -> bool:
        """Answer a bad frame; True when the connection was closed for too many in a row."""
        if session.bad_frames.bad():
            self.metrics.errors.labels("closed_bad_frames").inc()
            await ws.close(
                CloseCode.POLICY_VIOLATION, f"{session.bad_frames.limit} bad frames in a row: {exc.message}"[:120]
            )
            return True
        session.error(exc.code, exc.message, exc.id)
        return False


Route = Callable[[GatewayServer, ServerConnection, Request], Response | Awaitable[Response] | None]

# The paths served on the WebSocket's port (docs/wire-protocol.md#12-http-endpoints-on-the-same-port,
# docs/wire-protocol.md#16-agents-and-the-conversation-list); a key ending in `*` takes every path it
# begins. Any other path: 404 naming the WebSocket endpoint.
ROUTES: Final[Mapping[str, Route]] = {
    #  path                 route                           token?
    "/healthz":          GatewayServer._healthz,        # no   200 ok: the process is up
    "/readyz":           GatewayServer._readyz,         # no   200 ready (generation …), or 503 not ready: why (draining, store down)
    "/metrics":          GatewayServer._metrics_page,   # no   Prometheus text
    "/":                 GatewayServer._console,        # no   the web console (gateway/static/index.html)
    "/index.html":       GatewayServer._console,
    "/static/*":         GatewayServer._static,         # no   the console's assets; 404 for any other name
    "/agents":           GatewayServer._agents,         # yes  JSON: the agents served, the default
    "/v1/conversations": GatewayServer._conversations,  # yes  JSON: a page of the caller's own conversations
    WS_PATH:             GatewayServer._handshake,      # yes  None: the WebSocket handshake goes on, unless refused
}  # fmt: skip


def route(path: str) -> Route:
    """The route of a request path (without its query)."""
    if path in ROUTES:
        return ROUTES[path]
    prefixed = (r for key, r in ROUTES.items() if key.endswith("*") and path.startswith(key[:-1]))
    return next(prefixed, GatewayServer._not_found)


def _path(request: Request) -> str:
    return request.path.partition("?")[0]


def _upgrade_trace(request: Request | None) -> Context | None:
    """The W3C trace context a client sent with its WebSocket upgrade (docs/design.md#tracing)."""
    return None if request is None else trace_parent(request.headers)


def trace_parent(headers: Headers) -> Context | None:
    """The W3C trace context of a request's headers: one `traceparent`, its `tracestate` lines joined.
    None without one (each command then starts a trace)."""
    if not tracing.active():
        return None
    parents = headers.get_all("traceparent")
    if len(parents) != 1:  # several: none of them is the caller's trace
        return None
    return tracing.parent({"traceparent": parents[0], "tracestate": ",".join(headers.get_all("tracestate"))})


def _response(status: HTTPStatus, body: bytes, content_type: str, extra: list[tuple[str, str]] | None = None) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Cache-Control", "no-store"),
            ("Connection", "close"),
            *(extra or []),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


def _json_response(request: Request, body: bytes) -> Response:
    """200 JSON. A page of another origin got here only if that origin may connect (`_caller`): it
    is told it may read the answer too."""
    origins = request.headers.get_all("Origin")
    cors = [("Access-Control-Allow-Origin", origins[0]), ("Vary", "Origin")] if len(origins) == 1 else []
    return _response(HTTPStatus.OK, body, "application/json", cors)


async def run(settings: Settings, backend: Backend) -> None:
    """Serve until SIGTERM/SIGINT, then drain (the CLI's `serve` calls this). Raises BindRefused."""
    server = GatewayServer(settings, backend)
    await server.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, server.drain_soon)
    await server.serve_forever()
