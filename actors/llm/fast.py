"""The fast stream path: one model attempt read off the wire by us, the request still built by LiteLLM.

Why: LiteLLM's streaming wrapper builds pydantic objects for every chunk (`CustomStreamWrapper` →
`chunk_creator`), which made up more than 90% of a conversation's CPU (bench/model_client_bench.py
measures it next to this path). What LiteLLM is good at — resolving a model string to its provider,
endpoint, auth headers and request body — it still does, once per call, through its own provider
configs (`get_llm_provider`, `ProviderConfigManager.get_provider_chat_config`, `get_optional_params`
→ the config's `map_openai_params`, then `validate_environment`, `get_complete_url`,
`transform_request`: the steps its `BaseLLMHTTPHandler` takes). The response is ours: one pooled
aiohttp session per event loop, and the bytes fed to the wire's sans-I/O decoder (`DECODERS`:
`openai_wire.py`, `anthropic_wire.py`), whose model deltas go to the caller as they are.

`fast_stream` is one attempt of `stream_model` (docs/design.md#fallback): `ModelDelta`s, then one
`FastFinish` (finish reason, usage when the provider reports it), or a `ProviderError` carrying
the same kinds LiteLLM's exception mapping gives (`errors.classify`). Fallback,
call counting and salvage stay with `stream_model`. `fast_path_supports` says which calls may take
this path; a model's settings opt out with `stream_reader = "litellm"` (`STREAM_READER`).

This module imports nothing from `stream.py`, so that `stream.py` can import it.
"""

from __future__ import annotations

import asyncio
import atexit
import copy
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final, Protocol

import aiohttp
import msgspec

from actors.llm.anthropic_wire import AnthropicMessagesDecoder
from actors.llm.deltas import ModelDelta
from actors.llm.errors import SILENCE, Fault, ProviderError, Usage, answer_fault
from actors.llm.keys import MissingKey, call_kwargs, scrub
from actors.llm.lite import litellm_module, litellm_part
from actors.llm.openai_wire import OpenAIChatDecoder
from actors.llm.scripts import PROVIDER
from actors.llm.wires import PROVIDER_WIRES, Wire

# -- what the path yields ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FastFinish:
    """The last item: the finish reason in OpenAI's vocabulary (LiteLLM's `map_finish_reason`:
    Anthropic `end_turn`/`stop_sequence` → `stop`, `max_tokens` → `length`, …) and the usage the
    provider reported (None when it reported none)."""

    finish_reason: str
    usage: Usage | None


FastItem = ModelDelta | FastFinish


# -- which calls take the path -------------------------------------------------------------------


# A model setting of ours, never sent to a provider: "fast" (the default) or "litellm" (this model's
# calls go through LiteLLM's own stream wrapper — for a provider whose stream we misread, or to
# compare the two). `stream_model` removes it before the settings reach LiteLLM.
STREAM_READER: Final = "stream_reader"
READERS: Final = ("fast", "litellm")   # its values; anything but "fast" keeps a model off this path

# The settings this path knows how to send (docs/design.md#model-settings): any other key is a LiteLLM
# parameter we would have to re-implement (tools, response_format, api_version, extra_body, …), so
# a model that has one goes through LiteLLM.
FAST_SETTINGS: Final = frozenset({
    "api_base", "api_key_env", STREAM_READER, "timeout",
    "temperature", "top_p", "top_k", "max_tokens", "max_completion_tokens", "stop",
    "presence_penalty", "frequency_penalty", "seed", "user",
})


def without_reader_setting(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` as LiteLLM may receive them: without our `stream_reader`."""
    return {k: v for k, v in settings.items() if k != STREAM_READER}


@dataclass(frozen=True, slots=True)
class Route:
    """A model string resolved by LiteLLM: the provider's name for the model, the provider, the wire."""

    model: str
    provider: str
    wire: Wire
    api_base: str   # the base LiteLLM resolved (argument, settings or the provider's default)


def fast_path_supports(model: str, settings: Mapping[str, Any] | None = None, *, api_base: str | None = None) -> bool:
    """Whether `fast_stream` can make this call exactly as LiteLLM would: a provider in
    `PROVIDER_WIRES` (never `scripted/…`), only `FAST_SETTINGS`, no `stream_reader = "litellm"`, and
    an endpoint LiteLLM can name. `api_base` is `stream_model`'s argument (settings win over it)."""
    settings = settings or {}
    if settings.get(STREAM_READER, "fast") != "fast" or not FAST_SETTINGS.issuperset(settings):
        return False
    if model.startswith(f"{PROVIDER}/"):
        return False
    base = settings.get("api_base", api_base)
    return route(model, base if isinstance(base, str) else None) is not None


class _Failure(Exception):
    """Raised inside the readers; `fast_stream` turns it into a `ProviderError` for the model."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    @classmethod
    def of(cls, fault: Fault) -> _Failure:
        return cls(fault.kind, fault.message)


# -- the wire, sans I/O --------------------------------------------------------------------------


class Decoder(Protocol):
    """A wire's sans-I/O decoder: the bytes of each read in, the model deltas they complete out."""

    done: bool                  # the provider ended the answer
    failure: Fault | None       # an error event (or an unreadable stream) ended it
    events: int                 # events other than keep-alives so far
    finish_reason: str | None   # as the provider said it
    usage: Usage | None

    def feed(self, data: bytes) -> list[ModelDelta]: ...

    def end_reason(self) -> str | None: ...


DECODERS: Final[Mapping[Wire, Callable[[], Decoder]]] = {
    Wire.OPENAI_CHAT: OpenAIChatDecoder,
    Wire.ANTHROPIC_MESSAGES: AnthropicMessagesDecoder,
}


# -- the request, built by LiteLLM ---------------------------------------------------------------

@lru_cache(maxsize=512)
def route(model: str, api_base: str | None) -> Route | None:
    """How LiteLLM resolves `model` (None: not a call this path makes). Cached: resolution reads
    LiteLLM's model tables, not the key."""
    litellm = litellm_module()
    responses_api_bridge_check = litellm_part("responses.bridge_check").responses_api_bridge_check
    try:
        name, provider, _key, base = litellm.get_llm_provider(model, api_base=api_base)
    except Exception:
        return None     # LiteLLM's own path raises its own error for it
    wire = PROVIDER_WIRES.get(provider)
    if wire is None:
        return None
    config = _config(name, provider)
    base = base or api_base
    if provider in ("openai", "anthropic"):
        base = config.get_api_base(base)
    if base is None:
        return None     # e.g. hosted_vllm with no api_base: LiteLLM reads its variables
    if responses_api_bridge_check(model=name, custom_llm_provider=provider, api_base=base)[0].get("mode") == "responses":
        return None     # LiteLLM would call the Responses API for it
    return Route(name, provider, wire, base)


def _config(name: str, provider: str) -> Any:
    providers = litellm_module().LlmProviders
    return litellm_part("utils").ProviderConfigManager.get_provider_chat_config(model=name, provider=providers(provider))


@dataclass(frozen=True, slots=True)
class FastRequest:
    route: Route
    url: str
    headers: Mapping[str, str]
    body: bytes
    read_timeout_s: float
    key: str | None   # to scrub error text of; never logged

    @property
    def origin(self) -> str:
        """scheme://host[:port] of the URL: what picks a proxy."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme}://{rest.split('/', 1)[0]}"


DEFAULT_TIMEOUT_S: Final = 600.0   # LiteLLM's COMPLETION_HTTP_FALLBACK_SECONDS when no timeout is given


def build_request(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    headers: Mapping[str, str],
    settings: Mapping[str, Any],
    api_base: str | None = None,
    api_key: str | None = None,
    max_tokens: int | None = None,
    timeout_s: float | None = None,
    include_usage: bool = True,
) -> FastRequest:
    """The request LiteLLM would send for this call, with the stream's usage asked for. Settings win
    over the arguments, as in `stream_model`. Raises `_Failure` (auth) when no key can be found."""
    try:
        own, key = call_kwargs(settings)
    except MissingKey as exc:
        raise _Failure("auth", str(exc)) from None
    own.pop(STREAM_READER, None)
    base = own.pop("api_base", api_base)
    key = own.pop("api_key", None) or api_key
    timeout = own.pop("timeout", timeout_s)
    if "max_tokens" not in own and max_tokens is not None:
        own["max_tokens"] = max_tokens
    found = route(model, base)
    if found is None:
        raise ValueError(f"{model!r} is not a call the fast path makes: check fast_path_supports first")
    litellm = litellm_module()
    get_litellm_params = litellm_part("litellm_core_utils.get_litellm_params").get_litellm_params
    config = _config(found.model, found.provider)
    if key is None:
        key = litellm.get_llm_provider(model, api_base=base)[2]
        if key is None and found.provider in ("openai", "anthropic"):
            key = config.get_api_key()
        if key is None and found.provider == "openai":
            # The OpenAI SDK refuses to start without one; LiteLLM maps that to AuthenticationError.
            raise _Failure("auth", "no api key: name its variable in the model's api_key_env")
    try:   # LiteLLM refusing the request (an unsupported parameter, a message it cannot translate)
        optional = copy.deepcopy(_optional_params(found, include_usage, msgspec.json.encode(sorted(own.items()))))
        extra_body = optional.pop("extra_body", None)
        params = get_litellm_params(api_base=found.api_base, custom_llm_provider=found.provider)
        msgs = [dict(m) for m in messages]
        out_headers = config.validate_environment(
            headers=dict(headers), model=found.model, messages=msgs, optional_params=optional,
            litellm_params=params, api_key=key, api_base=found.api_base,
        )
        url = config.get_complete_url(api_base=found.api_base, api_key=key, model=found.model, optional_params=optional,
                                      litellm_params=params, stream=True)
        body = config.transform_request(model=found.model, messages=msgs, optional_params=optional,
                                        litellm_params=params, headers=out_headers)
        if found.wire is Wire.ANTHROPIC_MESSAGES:
            url = litellm_part("litellm_core_utils.url_utils").ensure_api_route(url, "v1/messages")   # as LiteLLM's dispatch
            out_headers, body = litellm_part("anthropic_beta_headers_manager").update_request_with_filtered_beta(
                headers=out_headers, request_data=body, provider=found.provider, api_base=found.api_base)
            body = dict(litellm_part("anthropic_beta_gated_fields").strip_beta_gated_request_body(
                body, out_headers, drop_params=None, model=found.model, provider=found.provider))
        if extra_body:
            body = {**body, **config.transform_extra_body(extra_body=extra_body, request=body, model=found.model,
                                                          litellm_params=params)}
        if config.supports_stream_param_in_request_body:
            body["stream"] = True
    except Exception as exc:
        raise _Failure("bad_request", scrub(f"{type(exc).__name__}: {exc}", key)[:500]) from None
    return FastRequest(found, url, {str(k): str(v) for k, v in out_headers.items()}, msgspec.json.encode(body),
                       float(timeout) if timeout is not None else DEFAULT_TIMEOUT_S, key)


@lru_cache(maxsize=512)
def _optional_params(found: Route, include_usage: bool, settings: bytes) -> dict[str, Any]:
    """LiteLLM's mapping of the settings to the provider's parameters (its supported-parameter checks,
    `map_openai_params`, unknown ones to `extra_body`): a function of the settings alone, so it runs
    once per model and settings, not once per call (it reads model tables: ~0.3 ms). Copy before use."""
    own = dict(msgspec.json.decode(settings))
    if include_usage and found.wire is Wire.OPENAI_CHAT and "stream_options" in (
            _config(found.model, found.provider).get_supported_openai_params(found.model) or ()):
        own["stream_options"] = {"include_usage": True}
    return dict(litellm_part("utils").get_optional_params(model=found.model, custom_llm_provider=found.provider,
                                                          stream=True, **own))


# -- the transport -------------------------------------------------------------------------------

# One pooled session per event loop (a session's connections belong to the loop that opened them).
# No connection limit: a host streams every conversation's model call at once.
# One pooled session per event loop. A session holds its loop, so a weak map would never let go.
_sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        _reap()
        # No cookie jar: a provider's cookies must not ride along on another conversation's call.
        # Not trust_env: aiohttp would then look the proxy and ~/.netrc up in a thread on every
        # request; `_proxy` reads the proxy variables once per endpoint instead.
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(),
                                        timeout=aiohttp.ClientTimeout(total=None))
        _sessions[loop] = session
    return session


def _reap() -> None:
    """Drop the sessions of loops that ended without `aclose_sessions()` (a test's): their sockets
    went with the loop. Marked closed, so aiohttp does not report them unclosed."""
    for loop in [loop for loop in _sessions if loop.is_closed()]:
        _forget(_sessions.pop(loop))


def _forget(session: aiohttp.ClientSession) -> None:
    connector = session.connector
    if connector is not None and not connector.closed:
        connector._close()  # the synchronous half of close(): nothing is left to await


@atexit.register
def _forget_all() -> None:
    """At exit: the last loop's session too (a worker that never closed it)."""
    for session in _sessions.values():
        _forget(session)


@lru_cache(maxsize=256)
def _proxy(origin: str) -> tuple[Any, Any]:
    """The HTTP(S)_PROXY / NO_PROXY proxy for an endpoint (LiteLLM's httpx client honours them too)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        return get_env_proxy_for_url(URL(origin))
    except LookupError:
        return None, None


async def aclose_sessions() -> None:
    """Close this event loop's pooled session (at shutdown; tests between loops)."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


class _Watchdog:
    """The stream's two timeouts, with one timer handle re-armed lazily instead of a timer per read
    (aiohttp's `sock_read` re-arms one on every read: measured ~3 µs per chunk).

    - `timeout_s`, every read: nothing at all from the provider for that long while we wait (LiteLLM's
      httpx read timeout);
    - `idle_timeout_s`, after the first delta: no event for that long while we wait — keep-alives do
      not count, and neither does the time the consumer spends on a delta (`stream_model`'s per-chunk
      timeout).
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


async def fast_stream(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    headers: Mapping[str, str],
    settings: Mapping[str, Any],
    api_base: str | None = None,
    api_key: str | None = None,
    max_tokens: int | None = None,
    timeout_s: float | None = None,
    idle_timeout_s: float | None = None,
    include_usage: bool = True,
) -> AsyncGenerator[FastItem, None]:
    """One model attempt: `ModelDelta`s, then a `FastFinish`; or a `ProviderError`.

    `headers` go with the request (the conversation and call index, see scripts.py); `settings` are
    the model's (its key read from `api_key_env` here, at the call; settings win over `api_base`,
    `api_key`, `max_tokens`, `timeout_s`). `timeout_s` bounds the wait for the answer's headers and
    then every read, as LiteLLM's `timeout` does; `idle_timeout_s` bounds the wait for each event
    after the first delta. `include_usage` asks an OpenAI-compatible provider for the usage chunk
    (Anthropic always sends usage). Once the finish reason is in, a failure (reading the usage) no
    longer fails the answer. Close it early (`aclose()`) to abort the generation: the HTTP response
    is closed, so the provider sees the client go away.
    """
    key: str | None = None
    delivered = False
    response: aiohttp.ClientResponse | None = None
    decoder: Decoder | None = None
    dog: _Watchdog | None = None
    read_timeout = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    whole = False    # the body was read to its end: the connection may go back to the pool
    try:
        try:
            request = build_request(model, messages, headers=headers, settings=settings, api_base=api_base,
                                    api_key=api_key, max_tokens=max_tokens, timeout_s=timeout_s,
                                    include_usage=include_usage)
            key, read_timeout, wire = request.key, request.read_timeout_s, request.route.wire
            proxy, proxy_auth = _proxy(request.origin)
            async with asyncio.timeout(read_timeout):   # connect, send, the answer's status line and headers
                response = await _session().post(request.url, data=request.body, headers=request.headers,
                                                 allow_redirects=False, proxy=proxy, proxy_auth=proxy_auth)
                if response.status >= 300:
                    raise await _status_failure(wire, response)
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
                    if dog.idle_limit is None and idle_timeout_s is not None:
                        dog.start_idle(idle_timeout_s)
                if decoder.failure is not None:
                    raise _Failure.of(decoder.failure)
            if decoder.done:
                whole = await _drain(content)
            finish = _finish(decoder)
        except (_Failure, TimeoutError, aiohttp.ClientError) as exc:
            if decoder is None or decoder.finish_reason is None:
                raise _provider_error(exc, model, key, delivered, dog, idle_timeout_s, read_timeout,
                                      answered=response is not None) from (
                    exc if key is None and not isinstance(exc, _Failure) else None)
            finish = _finish(decoder)   # the answer is whole; only what follows it failed
    finally:
        if dog is not None:
            dog.cancel()
        if response is not None:
            if whole:
                response.release()
            else:
                response.close()   # aborts the generation: the provider sees the connection go
    yield finish


def _provider_error(exc: BaseException, model: str, key: str | None, delivered: bool, dog: _Watchdog | None,
                    idle_timeout_s: float | None, read_timeout: float, *, answered: bool) -> ProviderError:
    if isinstance(exc, _Failure):
        kind, message = exc.kind, exc.message
    elif isinstance(exc, TimeoutError):   # before the headers, a read, or the idle timeout
        kind = "timeout"
        if dog is not None and dog.tripped == "idle":
            assert idle_timeout_s is not None   # the idle clock runs only when there is one
            message = SILENCE.format(idle_timeout_s)
        else:
            message = f"nothing received for {read_timeout:g} s"
    else:
        # Before the provider answered (refused, reset, DNS), LiteLLM's mapping says InternalServerError;
        # a stream that breaks once it has begun is an APIConnectionError.
        kind, message = "connection" if answered else "server_error", f"{type(exc).__name__}: {exc}"
    return ProviderError(kind, model, scrub(message, key)[:500], after_first_delta=delivered)


DRAIN_S: Final = 1.0


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


def _finish(decoder: Decoder) -> FastFinish:
    """The finish reason in OpenAI's vocabulary (LiteLLM's `map_finish_reason`), and the usage."""
    reason = decoder.end_reason()
    if reason is None:
        raise _Failure("connection", "the stream ended before a finish reason was received")
    map_finish_reason = litellm_part("litellm_core_utils.core_helpers").map_finish_reason
    return FastFinish(map_finish_reason(reason), decoder.usage)


async def _status_failure(wire: Wire, response: aiohttp.ClientResponse) -> _Failure:
    """An error status: its kind from the body's text and the status; its message from the body."""
    body = await response.content.read(64 << 10)
    return _Failure.of(answer_fault(wire, response.status, response.reason, body))


__all__ = [
    "DECODERS",
    "FAST_SETTINGS",
    "READERS",
    "STREAM_READER",
    "Decoder",
    "FastFinish",
    "FastItem",
    "FastRequest",
    "aclose_sessions",
    "build_request",
    "fast_path_supports",
    "fast_stream",
    "route",
    "without_reader_setting",
]
