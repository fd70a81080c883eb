"""`reactgate mock-llm --script F`: the scripted model as an OpenAI-compatible HTTP endpoint (docs/design.md#scripted-model).

It lets the HTTP path be tested end to end: LiteLLM's `openai/NAME` provider with
`api_base=http://HOST:PORT/v1` streams the same deltas the `scripted/` custom provider streams for
the same script (both read `Round.chunks`), and a scripted error comes back as the HTTP status
LiteLLM maps to the same exception class (`ERROR_TABLE`).

Playback position: the `X-Reactgate-Conversation` / `X-Reactgate-Call-Index` headers that
`stream_model` sends with every call; without them, a counter per conversation (or one global
counter) in this process.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from actors.llm.errors import ERROR_TABLE, SCRIPT_EXHAUSTED, ErrorKind
from actors.llm.scripts import (
    CallCounter,
    Round,
    RoundUsage,
    Script,
    ScriptError,
    ScriptExhausted,
    hang,
    load_script,
    playback_position,
)

# A mid-stream error arrives inside a 200 stream, so LiteLLM can only classify it by its text
# (`exception_mapping_utils`). These messages make it land on the same kind as the custom
# provider; kinds a real provider never reports mid-stream (auth, not_found, unavailable) come
# back as `connection`.
MID_STREAM_MESSAGES: dict[ErrorKind, str] = {
    ErrorKind.RATE_LIMIT: "Rate limit reached (429)",
    ErrorKind.TIMEOUT: "A timeout occurred",
    ErrorKind.SERVER_ERROR: "The server had an error processing your request.",
    ErrorKind.BAD_REQUEST: "invalid_request_error",
}


@dataclass
class MockStats:
    """What the endpoint served — lets tests see hidden retries and aborted streams."""

    requests: int = 0
    streams_completed: int = 0
    streams_aborted: int = 0          # the client went away mid-stream
    _changed: asyncio.Event | None = field(default=None, repr=False)

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
_COUNTER: web.AppKey[CallCounter] = web.AppKey("counter", CallCounter)
STATS: web.AppKey[MockStats] = web.AppKey("stats", MockStats)


def _error_response(status: int, kind: str, message: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return web.json_response(body, status=status)


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        body = await request.json()
    except ValueError:
        return _error_response(400, "invalid_request_error", "request body is not JSON")
    if not isinstance(body, dict):
        return _error_response(400, "invalid_request_error", "request body must be a JSON object")
    model = str(body.get("model") or "scripted")
    request.app[STATS]._bump("requests")

    conversation, index = playback_position(request.headers)
    if index is None:
        index = request.app[_COUNTER].next(conversation or "")
    try:
        round_ = request.app[_SCRIPT].answer(index, body.get("messages") or [], model)
    except ScriptExhausted as exc:
        return _error_response(400, SCRIPT_EXHAUSTED, str(exc))

    if round_.error is not None and not round_.chunks:
        if round_.delay_ms:
            await asyncio.sleep(round_.delay_s)
        status, _ = ERROR_TABLE[round_.error]
        return _error_response(status, round_.error.value, f"scripted {round_.error.value}")

    messages = body.get("messages") or []
    if body.get("stream"):
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return await _stream(request, model, round_, round_.reported_usage(messages) if include_usage else None)
    return await _complete(model, round_, round_.reported_usage(messages))


def _usage(usage: RoundUsage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


async def _stream(request: web.Request, model: str, round_: Round, usage: RoundUsage | None) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": model}
    delay = round_.delay_s
    stats = request.app[STATS]
    try:
        for i, text in enumerate(round_.chunks):
            if round_.hangs_before(i):
                await hang()
            if delay:
                await asyncio.sleep(delay)
            delta = {"role": "assistant", "content": text} if i == 0 else {"content": text}
            await response.write(_sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}))
        if round_.hangs_before(len(round_.chunks)):
            await hang()
        if round_.error is not None:
            # A provider failing mid-stream: OpenAI sends an error event inside the 200 stream.
            kind = round_.error
            message = f"{MID_STREAM_MESSAGES.get(kind, '')} scripted {kind.value}".lstrip()
            await response.write(
                b"event: error\n" + _sse({"error": {"message": message, "type": kind.value, "code": kind.value}})
            )
        else:
            finish = {"index": 0, "delta": {}, "finish_reason": round_.finish_reason}
            await response.write(_sse({**base, "choices": [finish]}))
            if usage is not None:  # `stream_options.include_usage`: one more chunk, no choices, as OpenAI sends it
                await response.write(_sse({**base, "choices": [], "usage": _usage(usage)}))
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        stats._bump("streams_aborted")
        raise
    stats._bump("streams_completed")
    return response


async def _complete(model: str, round_: Round, usage: RoundUsage) -> web.Response:
    if round_.delay_ms:
        await asyncio.sleep(round_.delay_s * max(1, len(round_.chunks)))
    if round_.error is not None:
        status, _ = ERROR_TABLE[round_.error]
        return _error_response(status, round_.error.value, f"scripted {round_.error.value}")
    return web.json_response({
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "finish_reason": round_.finish_reason,
                     "message": {"role": "assistant", "content": "".join(round_.chunks)}}],
        "usage": _usage(usage),
    })


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [
        {"id": "scripted", "object": "model", "created": 0, "owned_by": "reactgate"}]})


def make_app(script: Script) -> web.Application:
    app = web.Application()
    app[_SCRIPT] = script
    app[_COUNTER] = CallCounter()
    app[STATS] = MockStats()
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
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
        gc.freeze()  # a provider does not pause every stream for a full collection (gateway/server.py)
        print(f"mock LLM playing {script_path} at http://{host}:{bound}/v1 "
              f"(LiteLLM model 'openai/<any>', api_base http://{host}:{bound}/v1)", flush=True)
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


__all__ = ["STATS", "ErrorKind", "MockStats", "make_app", "run_mock_server", "start_mock_server"]
