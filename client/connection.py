"""Run a `ClientSession` over a real WebSocket, reconnecting and resuming (docs/wire-protocol.md#13-writing-a-client-checklist).

A thin shell around the sans-I/O session: it connects with the `reactgate.v1` subprotocol (and a
bearer token when given), feeds every frame it reads to the session, sends the frames the session
returns, and hands every other output to whoever iterates it (`async for output in connection`).
On a lost connection it reconnects and the session resumes (re-open, subscribe after the last
delivered seq, re-send pending commands with their ids). A frame the server did not process
(`RetryLater`) is retried after `retry_pause_s`, a refused handshake (503) never sooner than its
`Retry-After`. Handshake refusals no retry can fix (HTTP 400,
401, 403, 404: docs/wire-protocol.md#a-refused-handshake), a fatal session error, or
`give_up_after_s` without a connection end the iteration with a `Fatal`. A deleted conversation
(`Deleted`: `session.delete()`, or anyone's delete) ends it as well, with nothing to reconnect to;
`session.export()` needs nothing from the shell: its outputs come through like any other.

The token may be a string or a callable returning the current one (sync or async), asked before
every connection attempt. When the server closes at the token's `exp` (4001, `TokenExpired`) a
callable gives the reconnect a fresh token and the session resumes; a fixed string would only be
refused (HTTP 401), so the iteration ends with a `Fatal` instead of retrying it.

Reconnects use websockets' own iterator (`async for ws in connect(...)`) with our two policies
injected: which failures are worth a retry (`process_exception`) and the delays (`reconnect_delays`,
drawn from `Backoff`). The iterator restarts its schedule whenever a handshake succeeds; we do not
reset `Backoff` until the session's `open` is acked, because a server that accepts and closes at
once (1013, max connections) must still be backed off — so a drop after a good handshake sleeps
from the same schedule before the iterator reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, cast

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.typing import Subprotocol

from client.session import (
    RETRY_PAUSE_S,
    ClientSession,
    Fatal,
    Opened,
    Output,
    Resumed,
    RetryLater,
    Send,
    TokenExpired,
)
from protocol.frames import SUBPROTOCOL, ClientFrame, ErrorCode

FATAL_HTTP_STATUS: Final = frozenset({400, 401, 403, 404})
OPEN_TIMEOUT_S: Final = 10.0
_encoder: Final = msgspec.json.Encoder()

# The JWT, or what returns the current one (None: connect without a token).
TokenSource = Callable[[], str | Awaitable[str | None] | None]


class _NoToken(Exception):
    """The token source failed: retried like a failed connection."""


class _Connect(connect):
    """websockets' `connect`, asking for its headers before every attempt (so that a reconnect
    carries the token source's current token)."""

    def __init__(self, uri: str, headers: Callable[[], Awaitable[dict[str, str] | None]], **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self._headers = headers

    async def connect(self) -> ClientConnection:
        self.additional_headers = await self._headers()
        return await super().connect()


@dataclass
class Backoff:
    """Exponential backoff with full jitter: attempt n sleeps uniform(0, min(cap, base·2ⁿ)).

    Full jitter spreads the reconnects of many clients dropped by one drain (1012) instead of
    sending them all back at the same instants (docs/wire-protocol.md#11-limits-slow-consumers-drain).
    """

    base_s: float = 0.2
    cap_s: float = 5.0
    rng: Callable[[], float] = random.random
    attempt: int = 0

    def bound(self, attempt: int) -> float:
        return float(min(self.cap_s, self.base_s * 2 ** min(attempt, 32)))

    def next_delay(self) -> float:
        delay = self.rng() * self.bound(self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


def retry_after_s(value: str | None) -> float:
    """A `Retry-After` in seconds (RFC 9110 §10.2.3: the gateway sends whole seconds); 0 when absent
    or given as a date, which this client does not trust a clock to read."""
    if value is None or not value.strip().isdecimal():
        return 0.0
    return float(value.strip())


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    """No connection now; the next attempt is in `retry_in_s` seconds."""

    reason: str
    retry_in_s: float


Item = Output | ConnectionLost


class _GiveUp(Exception):
    """No connection for longer than `give_up_after_s`."""


class Connection:
    """One session over one WebSocket at a time. Use as `async with Connection(...) as c:`, iterate
    it for the session's outputs, and `await c.flush()` after issuing a command on the session."""

    def __init__(
        self,
        session: ClientSession,
        url: str,
        *,
        token: str | TokenSource | None = None,
        backoff: Backoff | None = None,
        give_up_after_s: float | None = None,
        retry_pause_s: float = RETRY_PAUSE_S,
        open_timeout_s: float = OPEN_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session = session
        self.url = url
        self.token = token
        self.backoff = backoff or Backoff()
        self.give_up_after_s = give_up_after_s
        self.retry_pause_s = retry_pause_s
        self.open_timeout_s = open_timeout_s
        self._clock = clock
        self._items: asyncio.Queue[Item | None] = asyncio.Queue()   # None: the end
        self._send_lock = asyncio.Lock()
        self._ws: ClientConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}          # frame id → its retry
        self._retries: set[asyncio.Task[None]] = set()
        self._down_since: float | None = None
        self._failure = "cannot connect"
        self._retry_after_s = 0.0   # a refusal's Retry-After (an overloaded replica: docs/design.md#overload)
        self._closing = False
        self._error: BaseException | None = None
        self._token_expired = False                                  # the last connection closed with 4001

    # -- lifecycle and reading ---------------------------------------------------------------------

    async def __aenter__(self) -> Connection:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __aiter__(self) -> Connection:
        return self

    async def __anext__(self) -> Item:
        item = await self._items.get()
        if item is None:
            self._items.put_nowait(None)  # stay ended for any later reader
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return item

    async def close(self) -> None:
        """Close the WebSocket normally (1000) and stop reconnecting."""
        self._closing = True
        for timer in self._timers.values():
            timer.cancel()
        for retry in self._retries:
            retry.cancel()
        ws = self._ws
        if ws is not None:
            await ws.close()  # before leaving `connect`'s iterator, which would close with 1011
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def flush(self) -> None:
        """Send the frames the session produced; queue everything else for the reader."""
        async with self._send_lock:  # one batch at a time: frames leave in the session's order
            for output in self.session.outputs():
                if isinstance(output, Send):
                    await self._send(output.frame)
                else:
                    self._observe(output)
                    self._items.put_nowait(output)

    # -- the connect loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._connect_loop()
        except Exception as exc:  # a bug, not a network failure: the reader sees it
            self._error = exc
        finally:
            self._items.put_nowait(None)

    async def _connect_loop(self) -> None:
        self._down_since = self._clock()
        try:
            connector = _Connect(
                self.url, self._headers, subprotocols=[Subprotocol(SUBPROTOCOL)],
                open_timeout=self.open_timeout_s, max_size=None,  # the server's frames have no size limit
                process_exception=self._retryable, reconnect_delays=self._delays,
            )
        except InvalidURI as exc:
            self._end(str(exc))
            return
        attempts = cast(AsyncGenerator[ClientConnection, None], aiter(connector))
        try:
            async with contextlib.aclosing(attempts):
                async for ws in attempts:
                    reason = await self._serve(ws)
                    if reason is None:
                        return
                    if self._down_since is None:
                        self._down_since = self._clock()
                    if self._gave_up():
                        self._end(f"{reason}; no connection for {self.give_up_after_s:.0f} s")
                        return
                    delay = self.backoff.next_delay()
                    self._items.put_nowait(ConnectionLost(reason, delay))
                    await asyncio.sleep(delay)
        except InvalidStatus as exc:
            body = exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
            self._end(f"handshake refused with HTTP {exc.response.status_code}: {body}")
        except _GiveUp as exc:
            self._end(str(exc))

    async def _serve(self, ws: ClientConnection) -> str | None:
        """One connection, until it drops (the reason) or we are done with it (None)."""
        self._ws = ws
        self._token_expired = False
        reason = "connection closed by the server"
        try:
            self.session.connected()
            await self.flush()
            async for raw in ws:
                self.session.receive(raw)
                await self.flush()
                if self.session.ended is not None:
                    break
        except ConnectionClosed as exc:  # a drain (1012) or a lost network raises ConnectionClosedError
            received = exc.rcvd
            reason = f"connection lost ({received.code} {received.reason})" if received else "connection lost"
        finally:
            self._ws = None
            self.session.disconnected(ws.close_code)
            await self.flush()
        if self._closing or self.session.ended is not None:
            await ws.close()
            return None
        if self._token_expired and not callable(self.token):
            self._end("session expired: the token expired (close 4001) — sign in again with a fresh token")
            return None
        return reason

    async def _headers(self) -> dict[str, str] | None:
        """The handshake's Authorization header, with the token source's current token."""
        source, token = self.token, None
        if not callable(source):
            token = source
        else:
            try:
                got = source()
                token = await got if inspect.isawaitable(got) else got
            except Exception as exc:
                raise _NoToken(f"cannot get a token: {type(exc).__name__}") from exc
        return {"Authorization": f"Bearer {token}"} if token else None

    def _retryable(self, exc: Exception) -> Exception | None:
        """websockets' `process_exception`: None to retry, an exception to stop."""
        if isinstance(exc, InvalidStatus):
            if exc.response.status_code in FATAL_HTTP_STATUS:
                return exc
            body = exc.response.body.decode(errors="replace").strip() if exc.response.body else ""
            self._failure = f"HTTP {exc.response.status_code} {body}".strip()
            self._retry_after_s = retry_after_s(exc.response.headers.get("Retry-After"))
        elif isinstance(exc, OSError | TimeoutError | InvalidHandshake):
            self._failure = f"cannot connect: {exc}"
        elif isinstance(exc, _NoToken):
            self._failure = str(exc)
        else:
            return exc
        if self._gave_up():
            return _GiveUp(f"{self._failure}; no connection for {self.give_up_after_s:.0f} s")
        return None

    def _delays(self) -> Generator[float]:
        """websockets' `reconnect_delays`, from our schedule (reset only by an acked `open`)."""
        while True:
            # never sooner than the server asked: full jitter alone would send a refused client back at once
            delay = max(self.backoff.next_delay(), self._retry_after_s)
            self._retry_after_s = 0.0
            self._items.put_nowait(ConnectionLost(self._failure, delay))
            yield delay

    def _gave_up(self) -> bool:
        return (self.give_up_after_s is not None and self._down_since is not None
                and self._clock() - self._down_since > self.give_up_after_s)

    # -- outputs -----------------------------------------------------------------------------------

    async def _send(self, frame: ClientFrame) -> None:
        ws = self._ws
        if ws is None:
            return
        with contextlib.suppress(ConnectionClosed):  # still pending: the next connection sends it again
            await ws.send(_encoder.encode(frame).decode())

    def _observe(self, output: Output) -> None:
        match output:
            case Opened() | Resumed():
                self.backoff.reset()
                self._down_since = None
            case TokenExpired():
                self._token_expired = True
            case RetryLater(frame=frame, code=code, pause_s=pause_s) if not self._closing:
                # the server's own pause for a store outage (retry_after_ms); ours for rate_limited
                pause = pause_s if code is ErrorCode.UNAVAILABLE else self.retry_pause_s
                loop = asyncio.get_running_loop()
                self._timers[frame.id] = loop.call_later(pause, self._retry_soon, frame.id)

    def _retry_soon(self, frame_id: str) -> None:
        self._timers.pop(frame_id, None)
        task = asyncio.create_task(self._retry(frame_id))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _retry(self, frame_id: str) -> None:
        self.session.retry(frame_id)
        await self.flush()

    def _end(self, reason: str) -> None:
        self._items.put_nowait(Fatal(reason))
