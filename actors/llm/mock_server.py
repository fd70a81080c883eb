"""`reactgate mock-llm --script F`: the scripted model over HTTP, on both wires (docs/design.md#scripted-model).

It lets the HTTP path be tested end to end, channel and native rounds alike:
- OpenAI-compatible SSE at `POST /v1/chat/completions`, for LiteLLM's `openai/NAME` provider with
  `api_base=http://HOST:PORT/v1`;
- Anthropic Messages SSE at `POST /v1/messages`, for `anthropic/NAME` with `api_base=http://HOST:PORT`.

Each streams the round's deltas (`Round.stream`) in its provider's shapes (`mock_wires.py`), paced by
`scripts.play` as the in-process players pace them; a scripted error comes back as the HTTP status
LiteLLM maps to the same exception class (`ERROR_TABLE`), in the provider's error body. A request a
real provider would refuse is refused with that provider's 400 (`mock_refusals.py`) and counted
(`MockStats.refused`, `GET /stats`), so a test can assert reactgate sent none.

Playback position: the `X-Reactgate-Conversation` / `X-Reactgate-Call-Index` headers that
`stream_model` sends with every call; without them, a counter per conversation (or one global
counter) in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from actors.llm.errors import ERROR_TABLE, SCRIPT_EXHAUSTED, ErrorKind
from actors.llm.mock_refusals import ANTHROPIC_CHECKS, OPENAI_CHECKS, Check, Issued, Refusal, first_refusal
from actors.llm.mock_wires import (
    ANTHROPIC_ERROR_TYPES,
    AnthropicMessagesEncoder,
    Encoder,
    OpenAIChatEncoder,
    anthropic_error,
    anthropic_message,
    openai_completion,
    openai_error,
)
from actors.llm.scripts import (
    CallCounter,
    NoSubScript,
    Round,
    RoundFailed,
    RoundUsage,
    Script,
    ScriptError,
    ScriptExhausted,
    load_script,
    play,
    playback_position,
)

INVALID_REQUEST: Final = "invalid_request_error"


@dataclass
class MockStats:
    """What the endpoint served — lets tests see hidden retries and aborted streams."""

    requests: int = 0
    streams_completed: int = 0
    streams_aborted: int = 0          # the client went away mid-stream
    refused: int = 0                  # requests a real provider would refuse, refused with its 400
    refusals: list[str] = field(default_factory=list)   # the rule that refused each (the last 1,000), as `wire.rule`
    # The function names each request of a conversation offered, in order (the last 100 conversations):
    # what a test of native rounds checks the request's `tools` by (docs/design.md#native).
    offered: dict[str, list[list[str]]] = field(default_factory=dict)
    _changed: asyncio.Event | None = field(default=None, repr=False)

    def refuse(self, rule: str) -> None:
        self.refusals.append(rule)
        del self.refusals[:-1000]   # a long-running mock keeps the recent ones; `refused` counts them all
        self._bump("refused")

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "streams_completed": self.streams_completed,
                "streams_aborted": self.streams_aborted, "refused": self.refused, "refusals": list(self.refusals),
                "offered": self.offered}

    def note_tools(self, conversation: str, tools: Any) -> None:
        names = [str((t.get("function") or t).get("name")) for t in tools or [] if isinstance(t, dict)]
        self.offered.setdefault(conversation, []).append(names)
        while len(self.offered) > 100:
            del self.offered[next(iter(self.offered))]

    def _bump(self, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)
        if self._changed is not None:
            self._changed.set()  # wake every waiter; each re-checks its predicate
            self._changed = None

    async def wait_until(self, predicate: Callable[[MockStats], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self):
                if self._changed is None:
                    self._changed = asyncio.Event()
                await self._changed.wait()


_SCRIPT: web.AppKey[Script] = web.AppKey("script", Script)
_ISSUED: web.AppKey[Issued] = web.AppKey("issued", Issued)
_COUNTER: web.AppKey[CallCounter] = web.AppKey("counter", CallCounter)
STATS: web.AppKey[MockStats] = web.AppKey("stats", MockStats)


@dataclass(frozen=True)
class MockWire:
    """One wire the mock serves: where, what it refuses, and how it writes answers and failures."""

    name: str
    paths: tuple[str, ...]
    checks: Sequence[tuple[str, Check]]
    encoder: Callable[[str, RoundUsage], Encoder]
    complete: Callable[[str, Round, RoundUsage], dict[str, Any]]
    failure: Callable[[str, str], dict[str, Any]]       # (kind or error type, message) → the error body
    refused: Callable[[Refusal], dict[str, Any]]
    include_usage: Callable[[Mapping[str, Any]], bool]  # whether a stream ends with its usage


def _openai_include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


WIRES: Final[Sequence[MockWire]] = (
    MockWire(
        name="openai", paths=("/v1/chat/completions", "/chat/completions"), checks=OPENAI_CHECKS,
        encoder=lambda model, usage: OpenAIChatEncoder(model), complete=openai_completion,
        failure=lambda kind, message: openai_error(message, kind, code=kind),
        refused=lambda r: openai_error(r.message, INVALID_REQUEST, param=r.param, code=r.code),
        include_usage=_openai_include_usage,
    ),
    MockWire(
        name="anthropic", paths=("/v1/messages",), checks=ANTHROPIC_CHECKS,
        encoder=AnthropicMessagesEncoder, complete=anthropic_message,
        failure=lambda kind, message: anthropic_error(message, ANTHROPIC_ERROR_TYPES.get(kind, INVALID_REQUEST)),  # type: ignore[call-overload]
        refused=lambda r: anthropic_error(r.message, INVALID_REQUEST),
        include_usage=lambda body: True,   # message_start and message_delta always carry it
    ),
)


def _answer(wire: MockWire) -> Callable[[web.Request], Any]:
    async def answer(request: web.Request) -> web.StreamResponse:
        return await _serve(wire, request)
    return answer


async def _serve(wire: MockWire, request: web.Request) -> web.StreamResponse:
    def failed(status: int, kind: str, message: str) -> web.Response:
        return web.json_response(wire.failure(kind, message), status=status)

    try:
        body = await request.json()
    except ValueError:
        return failed(400, INVALID_REQUEST, "request body is not JSON")
    if not isinstance(body, dict):
        return failed(400, INVALID_REQUEST, "request body must be a JSON object")
    model = str(body.get("model") or "scripted")
    stats = request.app[STATS]
    stats._bump("requests")
    refusal = first_refusal(wire.checks, body, request.app[_ISSUED])
    if refusal is not None:   # before the playback position: a refused request plays no round
        stats.refuse(f"{wire.name}.{refusal.rule}")
        return web.json_response(wire.refused(refusal), status=400)

    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    conversation, index = playback_position(request.headers)
    stats.note_tools(conversation or "", body.get("tools"))
    if index is None:
        index = request.app[_COUNTER].next(conversation or "")
    try:
        round_ = request.app[_SCRIPT].answer(index, messages, model)
    except ScriptExhausted as exc:
        return failed(400, SCRIPT_EXHAUSTED, str(exc))
    except NoSubScript as exc:
        return failed(400, INVALID_REQUEST, str(exc))

    if round_.error is not None and not round_.stream:
        if round_.delay_ms:
            await asyncio.sleep(round_.delay_s)
        return failed(ERROR_TABLE[round_.error][0], round_.error.value, f"scripted {round_.error.value}")
    usage = round_.reported_usage(messages)
    if body.get("stream"):
        return await _stream(request, wire.encoder(model, usage), round_, usage if wire.include_usage(body) else None)
    if round_.delay_ms:
        await asyncio.sleep(round_.delay_s * max(1, len(round_.stream)))
    if round_.error is not None:
        return failed(ERROR_TABLE[round_.error][0], round_.error.value, f"scripted {round_.error.value}")
    return web.json_response(wire.complete(model, round_, usage))


async def _stream(request: web.Request, encoder: Encoder, round_: Round, usage: RoundUsage | None) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    stats = request.app[STATS]
    try:
        if opening := encoder.start():
            await response.write(opening)
        try:
            async with contextlib.aclosing(play(round_, read_timeout_s=None)) as deltas:
                async for delta in deltas:
                    if out := encoder.delta(delta):
                        await response.write(out)
        except RoundFailed as failure:
            await response.write(encoder.error(failure.error))
        else:
            await response.write(encoder.finish(round_.finish_reason, usage))
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        stats._bump("streams_aborted")
        raise
    stats._bump("streams_completed")
    return response


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [
        {"id": "scripted", "object": "model", "created": 0, "owned_by": "reactgate"}]})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS].as_json())


def make_app(script: Script) -> web.Application:
    app = web.Application()
    app[_SCRIPT] = script
    app[_ISSUED] = Issued.of(script)
    app[_COUNTER] = CallCounter()
    app[STATS] = MockStats()
    for wire in WIRES:
        for path in wire.paths:
            app.router.add_post(path, _answer(wire))
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/stats", _stats)
    return app


async def start_mock_server(
    script: Script | str | Path, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Start serving `script`; returns the runner (`await runner.cleanup()` stops it) and the bound port."""
    if not isinstance(script, Script):
        script = load_script(script)
    # handler_cancellation: a client that closes its stream (an aborted generation) stops the
    # handler at once, as a real provider stops generating; shutdown does not wait for slow rounds.
    runner = web.AppRunner(make_app(script), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, int(bound)


def run_mock_server(script_path: str | Path, host: str = "127.0.0.1", port: int = 8766) -> int:
    """Serve until interrupted (the `reactgate mock-llm` command). Returns the exit status."""
    try:
        script = load_script(script_path)
    except ScriptError as exc:
        print(f"reactgate mock-llm: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        runner, bound = await start_mock_server(script, host, port)
        gc.freeze()  # a provider does not pause every stream for a full collection (actors/heap.py)
        print(f"mock LLM playing {script_path} at http://{host}:{bound}/v1 "
              f"(LiteLLM model 'openai/<any>', api_base http://{host}:{bound}/v1; "
              f"'anthropic/<any>', api_base http://{host}:{bound})", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"reactgate mock-llm: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["STATS", "WIRES", "ErrorKind", "MockStats", "MockWire", "make_app", "run_mock_server", "start_mock_server"]
