"""The frontends' endpoints (docs/frontends.md): the AI SDK's UI message stream at `/api/chat` and
AG-UI at `/agui`, on the gateway's port.

A thin shell. gateway/aisdk.py and gateway/agui.py translate (events in, protocol events out);
gateway/front.py reads the request and writes the stream. Here a request becomes the *same* frames a
WebSocket client would send — decoded by `protocol.frames` with its limits, carried out by
`gateway.dispatch` with its owner checks, quotas, idempotency and refusals — and the answer is the
conversation's own event log, read through `Backend.subscribe` as every subscriber reads it. So a
frontend sees only what the runtime allowed, every character once (docs/design.md#guarantees), and a
cut stream loses nothing: the log is still there to resume from.

A disconnect never cancels a turn (it is only a closed stream); `POST /api/chat/{id}/cancel` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Final, Protocol

import msgspec
from opentelemetry.context import Context
from websockets.datastructures import Headers

from actors.hosting.backend import Backend, Export, Opened
from actors.hosting.owners import CONVERSATION_ID, chat_conversation_id
from actors.identity import Caller, Owner
from actors.quotas import QuotaExceeded, Scope
from gateway import agui, aisdk
from gateway.auth import Authenticated
from gateway.dispatch import Drain, dispatch, quota_error, refusal
from gateway.front import HttpExchange, HttpRequest, Refused
from gateway.settings import Settings
from protocol.events import AskUser, Event, TurnStarted
from protocol.frames import (
    Ack,
    ClientFrame,
    ErrorCode,
    ErrorFrame,
    FrameError,
    Mode,
    Open,
    ServerFrame,
    decode_client_frame,
    encode_frame,
)


class Gateway(Protocol):
    """What the shell needs of the gateway it serves on (gateway/server.py's GatewayServer)."""

    backend: Backend
    settings: Settings

    @property
    def ready(self) -> bool: ...
    def admit(self, headers: Headers, target: str) -> Authenticated | Refused: ...
    def trace_of(self, headers: Headers) -> Context | None: ...
    def origin_allowed(self, origins: list[str], host: str | None) -> bool: ...
    def hold_connection(self, address: str, owner: Owner) -> tuple[tuple[Scope, str], ...] | QuotaExceeded: ...
    def release_connection(self, held: tuple[tuple[Scope, str], ...]) -> None: ...
    def drain_soon(self) -> None: ...

log = logging.getLogger("reactgate.gateway.frontends")

# Every stream names the conversation behind the frontend's chat id: an app may go on over /ws with it,
# and an operator `replay`s it (docs/frontends.md#chat-ids).
CONVERSATION_HEADER: Final = "X-Reactgate-Conversation-Id"

# An error frame's code → the HTTP status its refusal gets here (the body is the error frame itself,
# exactly as /ws would send it: docs/wire-protocol.md#5-error-codes).
STATUS: Final[Mapping[ErrorCode, HTTPStatus]] = {
    ErrorCode.BAD_REQUEST:    HTTPStatus.BAD_REQUEST,
    ErrorCode.FORBIDDEN:      HTTPStatus.FORBIDDEN,
    ErrorCode.NOT_FOUND:      HTTPStatus.NOT_FOUND,
    ErrorCode.QUOTA_EXCEEDED: HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.RATE_LIMITED:   HTTPStatus.TOO_MANY_REQUESTS,
    ErrorCode.OVERLOADED:     HTTPStatus.SERVICE_UNAVAILABLE,
    ErrorCode.TOO_LARGE:      HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ErrorCode.UNAVAILABLE:    HTTPStatus.SERVICE_UNAVAILABLE,  # with Retry-After (`retry_after`)
}  # fmt: skip


def retry_after(frame: ErrorFrame) -> list[tuple[str, str]]:
    """The `Retry-After` header (RFC 9110 §10.2.3, whole seconds, rounded up) of a refusal that
    says when to try again (`unavailable`'s `retry_after_ms`); none otherwise."""
    if frame.retry_after_ms is None:
        return []
    return [("Retry-After", str(math.ceil(frame.retry_after_ms / 1000)))]


class Refusal(Exception):
    """The request is refused with this error frame; nothing was done for it."""

    def __init__(self, frame: ErrorFrame | None, status: HTTPStatus | None = None, text: str = "") -> None:
        super().__init__(frame.message if frame else text)
        self.frame, self.status, self.text = frame, status, text


@dataclass
class HttpPeer:
    """`gateway.dispatch.Peer` for one HTTP request: it keeps the replies its frames get."""

    owner: Owner
    caller: Caller
    trace_parent: Context | None
    max_watched: int = 0
    replies: list[ServerFrame] = field(default_factory=list)

    def send(self, frame: ServerFrame) -> None:
        self.replies.append(frame)

    def can_watch(self, conversation_id: str) -> bool:
        return False

    def watching(self, conversation_id: str) -> bool:
        return False

    def watch(self, conversation_id: str, after_seq: int) -> None:
        raise AssertionError("the frontends read the log through Backend.subscribe")

    def unwatch(self, conversation_id: str) -> None:
        raise AssertionError("the frontends read the log through Backend.subscribe")

    def export(self, frame_id: str, conversation_id: str, export: Export) -> None:
        raise AssertionError("the frontends do not export")


@dataclass(frozen=True)
class Call:
    """One admitted request: who asks, through which exchange."""

    request: HttpRequest
    exchange: HttpExchange
    who: Authenticated
    peer: HttpPeer

    @property
    def owner(self) -> Owner:
        return self.who.owner


Route = Callable[["Frontends", Call, str], Awaitable[None]]


class Frontends:
    def __init__(self, server: Gateway) -> None:
        self._server = server

    @staticmethod
    def takes(method: str, path: str) -> bool:
        """What gateway/front.py hands here instead of to websockets: these paths, and any request
        but a GET (websockets reads no body: a POST elsewhere gets its 404 here)."""
        return method != "GET" or path == "/agui" or path == "/api/chat" or path.startswith("/api/chat/")

    async def handle(self, request: HttpRequest, exchange: HttpExchange) -> None:
        found = _route(request.method, request.path)
        if request.method == "OPTIONS":
            await self._preflight(request, exchange)
            return
        if found is None:
            await _plain(exchange, HTTPStatus.NOT_FOUND, f"not found: {request.method} {request.path}")
            return
        server = self._server
        if not server.ready:
            await _plain(exchange, HTTPStatus.SERVICE_UNAVAILABLE, "draining: retry on another replica")
            return
        admitted = server.admit(request.headers, request.target)
        if not isinstance(admitted, Authenticated):
            await _plain(exchange, admitted.status, admitted.text.rstrip("\n"), admitted.headers)
            return
        peer = HttpPeer(admitted.owner, admitted.tool_caller(server.settings.tool_claims),
                        server.trace_of(request.headers))
        route, arg = found
        try:
            await route(self, Call(request, exchange, admitted, peer), arg)
        except Refusal as refused:
            await self._refuse(request, exchange, refused)

    # -- the AI SDK: docs/frontends.md#the-ai-sdk ------------------------------------------------

    async def _chat(self, call: Call, _: str) -> None:
        """`POST /api/chat`: DefaultChatTransport's body → a user_message (idempotent by the
        message's id) or the answers of tool outputs and approvals → the turn's UI message stream."""
        try:
            asked = aisdk.parse_chat_request(call.request.body)
        except aisdk.ChatRequestError as exc:
            raise Refusal(ErrorFrame(code=ErrorCode.BAD_REQUEST, message=str(exc))) from None
        cid, opened = await self._open(call, asked.chat_id, agent=asked.agent)
        head = opened.last_seq
        if asked.user_message is not None:
            message_id, text = asked.user_message
            ack = await self._frame(call, {"type": "user_message", "id": message_id, "conversation_id": cid,
                                           "text": text})
            after = 0 if ack.status == "duplicate" else head   # a repeat: its turn may be anywhere in the log
            first = _started_by(message_id)
        else:
            try:
                acks = [await self._frame(call, {"type": "answer", "id": f"answer-{ask_id}", "conversation_id": cid,
                                                 "ask_id": ask_id, "answer": answer}) for ask_id, answer in asked.answers]
                again = any(ack.status == "duplicate" for ack in acks)
            except Refusal as refused:  # no question waits for it: answered from elsewhere, or timed out
                if refused.frame is None or refused.frame.code is not ErrorCode.NOT_FOUND:
                    raise
                again = True
            if again:  # a retried POST, or one that comes late: its turn went on already
                await self._chat_resume(call, asked.chat_id)
                return
            after, first = head, _any_turn
        await self._stream_chat(call, cid, after, first)

    async def _chat_resume(self, call: Call, chat_id: str) -> None:
        """`GET /api/chat/{id}/stream`, the AI SDK's resume: 204 when no turn runs, else the running
        turn's response from its `start` (the client drops its partial message there), then live."""
        cid, opened = await self._open(call, chat_id, create=False)
        events = await self._log(call, cid, opened.last_seq)
        running = _running_turn(events)
        if running is None:
            await call.exchange.respond(HTTPStatus.NO_CONTENT, b"", "text/plain", self._cors(call.request))
            return
        await self._stream_chat(call, cid, running - 1, _any_turn)

    async def _chat_messages(self, call: Call, chat_id: str) -> None:
        """`GET /api/chat/{id}/messages`: the whole chat as UIMessage[] (a reloaded page's `messages`)."""
        cid, opened = await self._open(call, chat_id, create=False)
        messages = aisdk.ui_messages(await self._log(call, cid, opened.last_seq))
        await call.exchange.respond(HTTPStatus.OK, msgspec.json.encode(messages), "application/json",
                                    self._cors(call.request))

    async def _chat_cancel(self, call: Call, chat_id: str) -> None:
        """`POST /api/chat/{id}/cancel`: the real stop (the AI SDK's `stop()` only disconnects)."""
        cid, _ = await self._open(call, chat_id, create=False)
        ack = await self._frame(call, {"type": "cancel", "id": f"cancel-{uuid.uuid4().hex}", "conversation_id": cid})
        await call.exchange.respond(HTTPStatus.OK, msgspec.json.encode({"status": ack.status}), "application/json",
                                    self._cors(call.request))

    async def _stream_chat(self, call: Call, cid: str, after: int, first: Callable[[Event], bool]) -> None:
        stream: aisdk.UIMessageStream | None = None
        async with self._events(call, aisdk.HEADERS, cid) as events:
            async for event in events(after):
                if stream is None:
                    if not first(event):
                        continue
                    stream = aisdk.UIMessageStream(_turn_of(event))
                    await call.exchange.write(b"".join(map(aisdk.sse, stream.start())))
                chunks = stream.feed(event)
                if chunks:
                    await call.exchange.write(b"".join(map(aisdk.sse, chunks)))
                if stream.done:
                    break
            await call.exchange.write(aisdk.DONE)

    # -- AG-UI: docs/frontends.md#ag-ui ---------------------------------------------------------

    async def _agui(self, call: Call, _: str) -> None:
        """`POST /agui`: RunAgentInput → a user_message (idempotent by runId), the answers of a
        `resume`, a reattach after `after_seq`, or (nothing new) a snapshot of the thread."""
        try:
            asked = agui.parse_run_input(call.request.body, call.request.headers.get("Last-Event-ID"))
        except agui.RunInputError as exc:
            raise Refusal(ErrorFrame(code=ErrorCode.BAD_REQUEST, message=str(exc))) from None
        cid, opened = await self._open(call, asked.thread_id, agent=asked.agent, mode=asked.mode)
        run = agui.AguiRun(asked.thread_id, asked.run_id)
        head = opened.last_seq
        if asked.after_seq is not None:
            await self._reattach(call, cid, run, asked.after_seq)
            return
        if asked.user_message is not None:
            _, text = asked.user_message
            ack = await self._frame(call, {"type": "user_message", "id": asked.run_id, "conversation_id": cid,
                                           "text": text})
            after = 0 if ack.status == "duplicate" else head
            first, opening = _started_by(asked.run_id), run.start()
        elif asked.resume:
            for ask_id, answer in asked.resume:
                await self._frame(call, {"type": "answer", "id": f"{asked.run_id}:{ask_id}", "conversation_id": cid,
                                         "ask_id": ask_id, "answer": answer})
            after, first, opening = head, _any_turn, run.start()
        else:  # a page (re)loading the thread: what it holds, and no run goes on
            opening = run.start(await self._log(call, cid, head))
            await call.exchange.start(HTTPStatus.OK, [*agui.HEADERS.items(), (CONVERSATION_HEADER, cid),
                                                      *self._cors(call.request)])
            await call.exchange.write(b"".join(agui.sse(e, None) for e in [*opening, *run.finish()]))
            await call.exchange.end()
            return
        async with self._events(call, agui.HEADERS, cid) as events:
            await call.exchange.write(b"".join(agui.sse(e, None) for e in opening))
            started = False
            async for event in events(after):
                started = started or first(event)
                if started:
                    await call.exchange.write(_agui_batch(run.feed(event), event.seq))
                    if run.done:
                        break

    async def _reattach(self, call: Call, cid: str, run: agui.AguiRun, after_seq: int) -> None:
        """The documented extension (docs/frontends.md#reattach): go on after the last seq the client
        saw, re-opening RUN_STARTED and whatever was open then, so the client's order checks pass."""
        async with self._events(call, agui.HEADERS, cid) as events:
            run_so_far: list[Event] = []   # the events of the run the client was in, up to `after_seq`
            reopened = False
            async for event in events(0):
                if not reopened:
                    # a run begins with a turn, or where a turn goes on after the question that ended one
                    if isinstance(event.data, TurnStarted) or (run_so_far and isinstance(run_so_far[-1].data, AskUser)):
                        run_so_far = []
                    run_so_far.append(event)
                    if event.seq <= after_seq:
                        continue
                    run.start()
                    for seen in run_so_far[:-1]:
                        run.feed(seen)
                    await call.exchange.write(b"".join(agui.sse(e, None) for e in run.reopen()))
                    reopened = True
                await call.exchange.write(_agui_batch(run.feed(event), event.seq))
                if run.done:
                    break

    # -- shared ---------------------------------------------------------------------------------

    async def _open(self, call: Call, chat_id: str, *, create: bool = True, agent: str | None = None,
                    mode: str | None = None) -> tuple[str, Opened]:
        """The conversation a frontend's chat id names (docs/frontends.md#chat-ids): one of ours as it
        is, else the caller's own conversation for that id, created on first use."""
        ours = bool(CONVERSATION_ID.match(chat_id))
        cid = chat_id if ours else chat_conversation_id(call.owner, chat_id)
        frame = Open(id=f"open-{uuid.uuid4().hex[:8]}", conversation_id=cid, agent=agent,
                     mode=None if mode is None else Mode(mode))
        try:
            return cid, await self._server.backend.open(call.owner, cid, agent, mode,
                                                         create_missing=create and not ours)
        except Exception as exc:
            raise Refusal(self._refused(exc, frame)) from None

    async def _frame(self, call: Call, fields: dict[str, Any]) -> Ack:
        """One client frame, decoded with /ws's rules and carried out by /ws's dispatch: its ack, or
        the refusal /ws would send."""
        try:
            frame = decode_client_frame(msgspec.json.encode(fields))
        except FrameError as exc:
            raise Refusal(ErrorFrame(code=exc.code, message=exc.message, id=exc.id)) from None
        await dispatch(frame, call.peer, self._server.backend, self._server.drain_soon)
        if not call.peer.replies:  # a replaced configuration: this replica drains (gateway/dispatch.py Drain)
            raise Refusal(None, HTTPStatus.SERVICE_UNAVAILABLE, "draining: retry on another replica")
        reply = call.peer.replies.pop()
        if isinstance(reply, ErrorFrame):
            raise Refusal(reply)
        if not isinstance(reply, Ack):
            raise AssertionError(f"{type(frame).__name__} answered {type(reply).__name__}")
        return reply

    def _refused(self, exc: Exception, frame: ClientFrame) -> ErrorFrame | None:
        answer = refusal(exc, frame)
        if isinstance(answer, Drain):
            self._server.drain_soon()
            return None
        return answer

    async def _log(self, call: Call, cid: str, head: int) -> list[Event]:
        """The conversation's log up to `head`, as subscribers read it."""
        events: list[Event] = []
        if head == 0:
            return events
        subscription = self._server.backend.subscribe(call.owner, cid, 0)
        async with contextlib.aclosing(subscription):  # type: ignore[type-var]
            async for batch in subscription:
                events.extend(e for e in batch if e.seq <= head)
                if batch and batch[-1].seq >= head:
                    break
        return events

    @contextlib.asynccontextmanager
    async def _events(self, call: Call, headers: Mapping[str, str], cid: str) -> AsyncIterator[
            Callable[[int], AsyncIterator[Event]]]:
        """An open event stream of conversation `cid`: counted against the connection quotas as a
        WebSocket is, started with `headers` (and the conversation's id, for /ws and `replay`), ended
        when the body is done or the client left."""
        address = call.exchange.transport.get_extra_info("peername") if call.exchange.transport else None
        held = self._server.hold_connection(str(address[0]) if address else "", call.owner)
        if isinstance(held, QuotaExceeded):
            raise Refusal(quota_error(held))
        try:
            await call.exchange.start(HTTPStatus.OK, [*headers.items(), (CONVERSATION_HEADER, cid),
                                                      *self._cors(call.request)])

            async def events(after: int) -> AsyncIterator[Event]:
                subscription = self._server.backend.subscribe(call.owner, cid, after)
                async with contextlib.aclosing(subscription):  # type: ignore[type-var]
                    async for batch in _until_gone(subscription, call.exchange.gone):
                        for event in batch:
                            yield event

            yield events
            await call.exchange.end()
        finally:
            self._server.release_connection(held)

    async def _refuse(self, request: HttpRequest, exchange: HttpExchange, refused: Refusal) -> None:
        if refused.frame is None:
            await _plain(exchange, refused.status or HTTPStatus.SERVICE_UNAVAILABLE,
                         refused.text or "draining: retry on another replica")
            return
        status = STATUS.get(refused.frame.code, HTTPStatus.INTERNAL_SERVER_ERROR)
        await exchange.respond(status, encode_frame(refused.frame), "application/json",
                               [*self._cors(request), *retry_after(refused.frame)])

    def _cors(self, request: HttpRequest) -> list[tuple[str, str]]:
        """A page of another origin got here only if that origin may connect (`admit`)."""
        origins = request.headers.get_all("Origin")
        if len(origins) != 1:
            return []
        return [("Access-Control-Allow-Origin", origins[0]), ("Vary", "Origin"),
                ("Access-Control-Expose-Headers", CONVERSATION_HEADER)]

    async def _preflight(self, request: HttpRequest, exchange: HttpExchange) -> None:
        """CORS preflight of a page from an origin that may connect; no token is asked (browsers send none)."""
        origins = request.headers.get_all("Origin")
        if not origins or not self._server.origin_allowed(origins, request.headers.get("Host")):
            await _plain(exchange, HTTPStatus.FORBIDDEN, "forbidden: origin not allowed")
            return
        await exchange.respond(HTTPStatus.NO_CONTENT, b"", "text/plain", [
            *self._cors(request), ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"),
            ("Access-Control-Allow-Headers", "Authorization, Content-Type, Last-Event-ID, traceparent, tracestate"),
            ("Access-Control-Max-Age", "600")])


async def _until_gone(subscription: AsyncIterator[list[Event]], gone: asyncio.Event) -> AsyncIterator[list[Event]]:
    """The subscription's batches until the client leaves (its next batch may be long in coming)."""
    left = asyncio.ensure_future(gone.wait())
    try:
        while True:
            batch = asyncio.ensure_future(anext(subscription))
            await asyncio.wait((batch, left), return_when=asyncio.FIRST_COMPLETED)
            if not batch.done():
                batch.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await batch
                return
            try:
                yield batch.result()
            except StopAsyncIteration:
                return
    finally:
        left.cancel()


def _started_by(message_id: str) -> Callable[[Event], bool]:
    """The first event of the turn this user message (or AG-UI run) starts."""
    return lambda event: isinstance(event.data, TurnStarted) and event.data.user_message_id == message_id


def _any_turn(event: Event) -> bool:
    """The first event of a turn that goes on (after an answer): any event of a turn."""
    return _turn_of(event) != ""


def _turn_of(event: Event) -> str:
    return str(getattr(event.data, "turn_id", ""))


def _running_turn(events: list[Event]) -> int | None:
    """The seq of the `turn.started` of the turn still running at the end of `events`, if any."""
    running: int | None = None
    for event in events:
        if isinstance(event.data, TurnStarted):
            running = event.seq
        elif event.event == "turn.completed":
            running = None
    return running


# (method, path) → route; `{id}` is one path segment, the chat id.
ROUTES: Final[Mapping[tuple[str, str], Route]] = {
    ("POST", "/api/chat"):               Frontends._chat,            # the UI message stream of the turn
    ("GET",  "/api/chat/{id}/stream"):   Frontends._chat_resume,     # 204, or the running turn from its start
    ("GET",  "/api/chat/{id}/messages"): Frontends._chat_messages,   # UIMessage[]: the whole chat
    ("POST", "/api/chat/{id}/cancel"):   Frontends._chat_cancel,     # cancel the running turn
    ("POST", "/agui"):                   Frontends._agui,            # an AG-UI run
}  # fmt: skip


def _route(method: str, path: str) -> tuple[Route, str] | None:
    parts = path.split("/")
    for (m, pattern), route in ROUTES.items():
        want = pattern.split("/")
        if m != method or len(want) != len(parts):
            continue
        if all(w == p or (w == "{id}" and p) for w, p in zip(want, parts, strict=True)):
            return route, next((p for w, p in zip(want, parts, strict=True) if w == "{id}"), "")
    return None


def _agui_batch(events: list[dict[str, Any]], seq: int) -> bytes:
    """The AG-UI events one of ours gave; the SSE `id:` (our seq) on the last only, so a client
    resuming after that id has every one of them."""
    return b"".join(agui.sse(e, seq if i == len(events) - 1 else None) for i, e in enumerate(events))


async def _plain(exchange: HttpExchange, status: HTTPStatus, text: str, headers: Sequence[tuple[str, str]] = ()) -> None:
    await exchange.respond(status, (text + "\n").encode(), "text/plain; charset=utf-8", headers)
