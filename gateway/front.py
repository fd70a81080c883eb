"""One port, two kinds of request: the WebSocket (and websockets' plain GET routes), or an HTTP
exchange with a body and a streamed answer (docs/frontends.md: the AI SDK and AG-UI endpoints, and
every request that is not a GET, which websockets cannot read).

websockets answers plain HTTP only as a GET without a body, with the whole response at once
(`process_request`); the frontends' endpoints need a POST body and an SSE response that lasts as long
as the turn. So every accepted socket starts in `FrontConnection`, websockets' own connection class
held back until the request head is in: a path `takes` claims is handed to an `HttpExchange`
(h11 reads the request and frames the response); anything else goes to websockets exactly as if it
had read the bytes itself. Nothing here knows a route: it only splits, reads and writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar, Final, cast

import h11
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers

log = logging.getLogger("reactgate.gateway.http")

MAX_HEAD_BYTES: Final = 64 * 1024   # past this the head goes to websockets, which refuses it (431/400)
HEAD_TIMEOUT_S: Final = 10.0        # as websockets' open_timeout: a silent socket is dropped


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    target: str            # the path with its query
    headers: Headers       # websockets' case-insensitive multi-dict, as the handshake's
    body: bytes

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]


@dataclass(frozen=True, slots=True)
class Refused:
    """A request refused before anything is done for it: its HTTP status and a text safe to send."""

    status: HTTPStatus
    text: str
    headers: tuple[tuple[str, str], ...] = ()   # Retry-After of a 503 (gateway/overload.py)


class ClientGone(Exception):
    """The client closed its side: nothing more can be written (the turn goes on without it)."""


Handler = Callable[[HttpRequest, "HttpExchange"], Awaitable[None]]


class HttpExchange(asyncio.Protocol):
    """One request and its response on one connection (`Connection: close`): `respond` for a whole
    answer; `start`, `write`…, `end` for a stream, with the transport's flow control (a slow reader
    makes `write` wait instead of growing a buffer)."""

    def __init__(self, handler: Handler, max_body: int, on_done: Callable[[HttpExchange], None]) -> None:
        self._handler = handler
        self._max_body = max_body
        self._on_done = on_done
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._request: h11.Request | None = None
        self._body = bytearray()
        self._writable = asyncio.Event()
        self._writable.set()
        self.gone = asyncio.Event()   # set when the client closed its side
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = _stream(transport)

    def data_received(self, data: bytes) -> None:
        if self._request is not None and self.task is not None:
            return  # one request per connection: what follows the body is not read
        self._h11.receive_data(data)
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc.error_status_hint, f"bad request: {exc}")
                return
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return
            if isinstance(event, h11.Request):
                self._request = event
                length = _header(event.headers, b"content-length")
                if length is not None and (not length.isdigit() or int(length) > self._max_body):
                    self._refuse(413, f"request body over {self._max_body} bytes")
                    return
            elif isinstance(event, h11.Data):
                self._body += event.data
                if len(self._body) > self._max_body:
                    self._refuse(413, f"request body over {self._max_body} bytes")
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._dispatch()
                return

    def eof_received(self) -> bool | None:
        self.gone.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone.set()
        self._writable.set()
        if self.task is None:
            self._on_done(self)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- the response --------------------------------------------------------------------------

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """The status line and headers of a streamed body (chunked: its length is not known)."""
        self._send(h11.Response(status_code=status, headers=[*headers, ("Connection", "close")]))

    async def write(self, data: bytes) -> None:
        if self.gone.is_set():
            raise ClientGone
        self._send(h11.Data(data=data))
        await self._writable.wait()
        if self.gone.is_set():
            raise ClientGone

    async def end(self) -> None:
        if not self.gone.is_set():
            self._send(h11.EndOfMessage())
        self.close()

    async def respond(self, status: int, body: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()) -> None:
        """A whole answer."""
        self._send(h11.Response(status_code=status, headers=[
            ("Content-Type", content_type), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
            ("Connection", "close"), *headers]))
        self._send(h11.Data(data=body))
        await self.end()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _send(self, event: Any) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.transport.write(self._h11.send(event) or b"")

    def _refuse(self, status: int, text: str) -> None:
        """A request h11 or the limits refuse, before any handler runs."""
        with contextlib.suppress(h11.LocalProtocolError):
            body = (text + "\n").encode()
            self._send(h11.Response(status_code=status, headers=[
                ("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                ("Connection", "close")]))
            self._send(h11.Data(data=body))
            self._send(h11.EndOfMessage())
        self.close()

    def _dispatch(self) -> None:
        request = self._request
        assert request is not None
        http = HttpRequest(
            method=request.method.decode("ascii", "replace"),
            target=request.target.decode("ascii", "replace"),
            headers=Headers([(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers]),
            body=bytes(self._body),
        )
        self.task = asyncio.get_running_loop().create_task(self._run(http))

    async def _run(self, request: HttpRequest) -> None:
        try:
            await self._handler(request, self)
        except ClientGone:
            pass
        except Exception:
            log.exception("HTTP %s %s failed", request.method, request.path)
            if self._h11.our_state is h11.SEND_RESPONSE:
                with contextlib.suppress(Exception):
                    await self.respond(500, b"internal error\n", "text/plain; charset=utf-8")
        finally:
            self.close()
            self._on_done(self)


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


class HttpFront:
    """What `FrontConnection` hands a claimed request to, and the exchanges it holds (drained with the
    gateway)."""

    def __init__(self, takes: Callable[[str, str], bool], handler: Handler, max_body: int) -> None:
        self.takes = takes
        self._handler = handler
        self._max_body = max_body
        self.exchanges: set[HttpExchange] = set()

    def exchange(self) -> HttpExchange:
        exchange = HttpExchange(self._handler, self._max_body, self.exchanges.discard)
        self.exchanges.add(exchange)
        return exchange

    def close_all(self) -> None:
        for exchange in list(self.exchanges):
            exchange.close()


def _stream(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """A TCP connection's transport. uvloop's (the default loop, gateway/cli.py) has asyncio.Transport's
    methods without deriving from it, so this is a cast, not an isinstance check."""
    return cast(asyncio.Transport, transport)


def front_connection(front: HttpFront) -> type[ServerConnection]:
    """websockets' connection class for `serve(create_connection=…)`, splitting on `front.takes`."""

    class FrontConnection(ServerConnection):
        http: ClassVar[HttpFront] = front
        _held: bytearray | None = None      # the head so far; None once decided
        _timer: asyncio.TimerHandle | None = None
        _transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            # websockets' own connection_made (which starts the handshake) waits for the decision
            self._transport = stream = _stream(transport)
            self._held = bytearray()
            self._timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT_S, stream.abort)

        def data_received(self, data: bytes) -> None:  # until the decision: the head so far
            held = self._held
            assert held is not None, "replaced by websockets' own once decided"
            held += data
            if b"\r\n\r\n" not in held and len(held) <= MAX_HEAD_BYTES:
                return
            self._decide(bytes(held))

        def _decide(self, head: bytes) -> None:
            assert self._transport is not None and self._timer is not None
            self._held = None
            self._timer.cancel()
            line = head.partition(b"\r\n")[0]
            method, _, rest = line.partition(b" ")
            target = rest.partition(b" ")[0]
            if self.http.takes(method.decode("latin-1"), target.partition(b"?")[0].decode("latin-1")):
                exchange = self.http.exchange()
                self._transport.set_protocol(exchange)
                exchange.connection_made(self._transport)
                exchange.data_received(head)
                return
            super().connection_made(self._transport)
            # From now on every read goes straight to websockets: no check of ours per frame.
            self.data_received = super().data_received  # type: ignore[method-assign]
            self._transport.set_protocol(self)  # uvloop reads the protocol's methods once, when it is set
            super().data_received(head)

        def eof_received(self) -> None:
            if self._held is not None:
                return  # closed before a head: nothing started (the transport closes itself)
            super().eof_received()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._held is not None:
                if self._timer is not None:
                    self._timer.cancel()
                return  # websockets never saw this socket
            super().connection_lost(exc)

    return FrontConnection
