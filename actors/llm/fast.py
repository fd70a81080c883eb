"""The fast reader: one model attempt read off the wire by us, the request still built by LiteLLM.

Why: LiteLLM's streaming wrapper builds pydantic objects for every chunk (`CustomStreamWrapper` →
`chunk_creator`), which made up more than 90% of a conversation's CPU (bench/model_client_bench.py
measures it next to this path). Here LiteLLM builds the request (`request.py`), we send it on the
pooled session (`transport.py`) and feed the response's bytes to the wire's sans-I/O decoder
(`DECODERS`: `openai_wire.py`, `anthropic_wire.py`), whose model deltas go to the caller as they are.

`fast_stream` is one attempt of `stream_model` (docs/design.md#fallback): model deltas (content,
reasoning, native calls: docs/design.md#native), then one
`ModelFinished` (finish reason, usage when the provider reports it), or a `ProviderError` with the
kinds LiteLLM's exception mapping gives for the same answer (`errors.py`). Fallback, call counting
and salvage stay with `stream_model`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Final, Protocol

import aiohttp

from actors.llm.anthropic_wire import AnthropicMessagesDecoder
from actors.llm.call import ModelCall
from actors.llm.deltas import ModelFinished, StreamItem
from actors.llm.errors import SILENCE, Fault, ProviderError, Usage, answer_fault
from actors.llm.keys import scrub
from actors.llm.lite import litellm_part
from actors.llm.openai_wire import OpenAIChatDecoder
from actors.llm.request import build_request
from actors.llm.transport import proxy_for, session
from actors.llm.wires import Wire
from protocol.deltas import ModelOutput


class Decoder(Protocol):
    """A wire's sans-I/O decoder: the bytes of each read in, the model deltas they complete out."""

    done: bool                  # the provider ended the answer
    failure: Fault | None       # an error event (or an unreadable stream) ended it
    events: int                 # events other than keep-alives so far
    finish_reason: str | None   # as the provider said it
    usage: Usage | None
    calls: int                  # native calls started in the message

    def feed(self, data: bytes) -> list[ModelOutput]: ...

    def end_reason(self) -> str | None: ...


DECODERS: Final[Mapping[Wire, Callable[[], Decoder]]] = {
    Wire.OPENAI_CHAT: OpenAIChatDecoder,
    Wire.ANTHROPIC_MESSAGES: AnthropicMessagesDecoder,
}

DRAIN_S: Final = 1.0
ERROR_BODY_BYTES: Final = 64 << 10


class _Failed(Exception):
    """The attempt failed with `fault`; raised inside `fast_stream`, reported as a `ProviderError`."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.message)
        self.fault = fault


class _Watchdog:
    """The stream's two timeouts, with one timer handle re-armed lazily instead of a timer per read
    (aiohttp's `sock_read` re-arms one on every read: measured ~3 µs per chunk).

    - `read_limit`, every read: nothing at all from the provider for that long while we wait
      (LiteLLM's httpx read timeout);
    - `idle_limit`, after the first delta: no event for that long while we wait — keep-alives do
      not count, and neither does the time the consumer spends on a delta (docs/design.md#continuation).
    A trip fails the pending read with TimeoutError."""

    def __init__(self, read_limit: float, response: aiohttp.ClientResponse) -> None:
        self.loop = asyncio.get_running_loop()
        self.read_limit = read_limit
        self.idle_limit: float | None = None   # set at the first delta
        self.response = response
        self.read_at = self.event_at = self.loop.time()
        self.waiting = True
        self.tripped: str | None = None   # "read" or "idle"
        self.handle = self.loop.call_at(self.read_at + read_limit, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        if self.waiting:
            if now - self.read_at >= self.read_limit:
                self.tripped = "read"
            elif self.idle_limit is not None and now - self.event_at >= self.idle_limit:
                self.tripped = "idle"
            if self.tripped is not None:
                self.response.content.set_exception(TimeoutError())   # wakes the pending read
                return
            deadline = self.read_at + self.read_limit
            if self.idle_limit is not None:
                deadline = min(deadline, self.event_at + self.idle_limit)
        else:   # the consumer has a delta: the clocks restart when it asks for the next one
            deadline = now + min(self.read_limit, self.idle_limit or self.read_limit)
        self.handle = self.loop.call_at(deadline, self._check)

    def start_idle(self, limit: float) -> None:
        """From the first delta on, silence is also bounded by `limit`."""
        self.idle_limit = limit
        self.handle.cancel()
        self.handle = self.loop.call_at(min(self.event_at + limit, self.read_at + self.read_limit), self._check)

    def cancel(self) -> None:
        self.handle.cancel()


async def fast_stream(call: ModelCall) -> AsyncGenerator[StreamItem, None]:
    """One model attempt: its model deltas, then a `ModelFinished`; or a `ProviderError`.

    The call's read timeout bounds the wait for the answer's headers and then every read, as
    LiteLLM's `timeout` does; its idle timeout bounds the wait for each event after the first
    delta. Once the finish reason is in, a failure (reading the usage) no longer fails the answer.
    Close it early (`aclose()`) to abort the generation: the HTTP response is closed, so the
    provider sees the client go away.
    """
    request = build_request(call)   # refused before anything is sent: a ProviderError of its own
    wire, key, read_timeout = request.route.wire, request.key, call.read_timeout_s
    delivered = False
    response: aiohttp.ClientResponse | None = None
    decoder: Decoder | None = None
    dog: _Watchdog | None = None
    whole = False    # the body was read to its end: the connection may go back to the pool
    try:
        try:
            proxy, proxy_auth = proxy_for(request.origin)
            http = await session()
            async with asyncio.timeout(read_timeout):   # connect, send, the answer's status line and headers
                response = await http.post(request.url, data=request.body, headers=request.headers,
                                           allow_redirects=False, proxy=proxy, proxy_auth=proxy_auth)
                if response.status >= 300:
                    body = await response.content.read(ERROR_BODY_BYTES)
                    raise _Failed(answer_fault(wire, response.status, response.reason, body))
            decoder = DECODERS[wire]()
            dog = _Watchdog(read_timeout, response)
            content, clock = response.content, dog.loop.time
            seen = 0
            while not decoder.done:
                data = await content.readany()
                if not data:
                    break
                dog.read_at = clock()
                deltas = decoder.feed(data)
                if decoder.events != seen:
                    seen, dog.event_at = decoder.events, dog.read_at
                for delta in deltas:
                    delivered = True
                    dog.waiting = False
                    yield delta
                    dog.read_at = dog.event_at = clock()
                    dog.waiting = True
                    if dog.idle_limit is None and call.idle_timeout_s is not None:
                        dog.start_idle(call.idle_timeout_s)
                if decoder.failure is not None:
                    raise _Failed(decoder.failure)
            if decoder.done:
                whole = await _drain(content)
            finish = _finish(call, decoder)
        except (_Failed, TimeoutError, aiohttp.ClientError) as exc:
            if decoder is None or decoder.finish_reason is None:
                # The provider's own exception may quote the key: chain it only when there is none.
                raise _provider_error(exc, call, key, delivered, dog, answered=response is not None) from (
                    exc if key is None and not isinstance(exc, _Failed) else None)
            finish = _finish(call, decoder)   # the answer is whole; only what follows it failed
    finally:
        if dog is not None:
            dog.cancel()
        if response is not None:
            if whole:
                response.release()
            else:
                response.close()   # aborts the generation: the provider sees the connection go
    yield finish


def _provider_error(exc: BaseException, call: ModelCall, key: str | None, delivered: bool, dog: _Watchdog | None,
                    *, answered: bool) -> ProviderError:
    if isinstance(exc, _Failed):
        kind, message = exc.fault.kind, exc.fault.message
    elif isinstance(exc, TimeoutError):   # before the headers, a read, or the idle timeout
        kind = "timeout"
        if dog is not None and dog.tripped == "idle":
            assert call.idle_timeout_s is not None   # the idle clock runs only when there is one
            message = SILENCE.format(call.idle_timeout_s)
        else:
            message = f"nothing received for {call.read_timeout_s:g} s"
    else:
        # Before the provider answered (refused, reset, DNS), LiteLLM's mapping says InternalServerError;
        # a stream that breaks once it has begun is an APIConnectionError.
        kind, message = "connection" if answered else "server_error", f"{type(exc).__name__}: {exc}"
    return ProviderError(kind, call.model, scrub(message, key)[:500], after_first_delta=delivered)


async def _drain(content: aiohttp.StreamReader) -> bool:
    """Read what follows the end event — normally only the chunked body's terminator — so that the
    connection can go back to the pool; a provider that holds the body open past the end of the
    answer is not waited for (its connection is closed instead)."""
    try:
        async with asyncio.timeout(DRAIN_S):
            while await content.readany():
                pass
    except TimeoutError:
        return False
    return True


def _finish(call: ModelCall, decoder: Decoder) -> ModelFinished:
    """The call's last item, its finish reason in OpenAI's vocabulary (LiteLLM's `map_finish_reason`).
    A message with calls that says `stop` (some OpenAI-compatible servers do) ends in `tool_calls`,
    as LiteLLM's stream wrapper reports it (`_normalize_tool_call_finish_reason`): every reader
    finishes a native message alike (docs/design.md#native)."""
    reason = decoder.end_reason()
    if reason is None:
        raise _Failed(Fault("connection", "the stream ended before a finish reason was received"))
    mapped = litellm_part("litellm_core_utils.core_helpers").map_finish_reason(reason)
    if mapped == "stop" and decoder.calls:
        mapped = "tool_calls"
    return ModelFinished(mapped, call.model, decoder.usage)
