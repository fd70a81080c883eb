"""One ASGI application behind one `HttpExchange` (gateway/front.py): how the MCP face runs the `mcp`
SDK's streamable-HTTP session manager, an ASGI app, on the gateway's own port (docs/design.md#mcp-face).

The exchange has read the whole request (its body within the gateway's frame limit) and writes
the response with h11 and the transport's flow control; this only translates: the request into an
ASGI `http` scope and one `http.request` message, `http.disconnect` once the client is gone, and
the app's `http.response.*` messages into the exchange's `start`/`write`/`end`. An answer with a
`Content-Length` goes out as is; a stream (the SDK's SSE) chunked, as long as the app writes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from gateway.front import HttpExchange, HttpRequest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
# The exchange frames the response itself (one request per connection, `Connection: close`).
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})


def http_scope(request: HttpRequest, exchange: HttpExchange, extra: Mapping[str, Any]) -> Scope:
    """The ASGI 3 `http` scope of the exchange's request; `extra` adds keys of the gateway's own."""
    transport = exchange.transport
    client = transport.get_extra_info("peername") if transport is not None else None
    server = transport.get_extra_info("sockname") if transport is not None else None
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": request.method, "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
        "query_string": request.query.encode("latin-1"), "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.raw_items()],
        "client": tuple(client[:2]) if client else None, "server": tuple(server[:2]) if server else None,
        "state": {}, **extra,
    }


async def serve_asgi(app: App, request: HttpRequest, exchange: HttpExchange, extra: Mapping[str, Any],
                     on_start: Callable[[int, list[tuple[bytes, bytes]]], None] | None = None,
                     headers: Sequence[tuple[str, str]] = ()) -> None:
    """Run `app` for the exchange's request until it has answered. `on_start` sees the status and
    headers as they go out (the MCP face learns a new session's id from them); `headers` are added
    to the app's (the gateway's CORS headers)."""
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await exchange.gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            status, sent = int(message["status"]), list(message.get("headers", ()))
            if on_start is not None:
                on_start(status, sent)
            await exchange.start(status, [*((k.decode("latin-1"), v.decode("latin-1")) for k, v in sent
                                            if k.lower() not in HOP_BY_HOP), *headers])
        elif kind == "http.response.body":
            body = bytes(message.get("body", b""))
            if body:
                await exchange.write(body)
            if not message.get("more_body", False):
                await exchange.end()

    await app(http_scope(request, exchange, extra), receive, send)
