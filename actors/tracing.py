"""Tracing: one user message, one trace — from the WebSocket upgrade to the model and the tools
(docs/design.md#tracing).

What a span is, and what it carries, is one table (`SPANS`): the gateway's command span, then on
the host the turn, its rounds, and each round's model calls and tool calls. A trace crosses
processes as a plain dict (`carrier`, `parent`: the W3C `traceparent`/`tracestate` pair), carried
on the command that starts a turn and kept in the turn's checkpoint.

Spans cost nothing unless a provider is installed: `configure` installs one only when the edge
gives it an OTLP endpoint (the OTLP exporter is imported only then), and every helper here returns
at once when none is. The per-delta path is never traced: a model call's span counts its chunks
and notes its first one, nothing more.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from enum import StrEnum
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from actors.llm.stream import ModelDelta, ModelFallback, ModelFinished, ProviderError, StreamItem

TRACER_NAME: Final = "reactgate"
TRACES_PATH: Final = "/v1/traces"
EXPORT_DELAY_MS: Final = 1000   # a turn ends a handful of spans: a collector sees them within a second


class SpanName(StrEnum):
    COMMAND = "reactgate.command"        # gateway: one client command, until its ack
    TURN = "reactgate.turn"              # host: a user message's turn, from start (or resumption) to its end
    ROUND = "reactgate.round"            # one decision, and the tool calls it asked for
    MODEL_CALL = "reactgate.model_call"  # one stream from the provider (its fallbacks included)
    TOOL_CALL = "reactgate.tool_call"    # one call, from submission to its observation


class Attr(StrEnum):
    CONVERSATION_ID = "reactgate.conversation_id"
    TURN_ID = "reactgate.turn_id"
    COMMAND = "reactgate.command"
    COMMAND_ID = "reactgate.command_id"
    MESSAGE_ID = "reactgate.message_id"
    RESUMED = "reactgate.turn.resumed"
    END_REASON = "reactgate.turn.end_reason"
    ROUND = "reactgate.round"
    PHASE = "reactgate.round.phase"
    ROUND_OUTCOME = "reactgate.round.outcome"
    MODEL = "gen_ai.request.model"
    RESPONSE_MODEL = "gen_ai.response.model"
    TIME_TO_FIRST_CHUNK_MS = "reactgate.model.time_to_first_chunk_ms"
    CHUNKS = "reactgate.model.chunks"
    FALLBACKS = "reactgate.model.fallbacks"
    FINISH_REASON = "reactgate.model.finish_reason"
    INPUT_TOKENS = "gen_ai.usage.input_tokens"
    OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    ERROR_TYPE = "error.type"
    TOOL_ID = "reactgate.tool.id"
    CALL_ID = "reactgate.tool.call_id"
    TRAIT = "reactgate.tool.trait"
    TOOL_OUTCOME = "reactgate.tool.outcome"     # "ok", or the observation's error code
    TOOL_DURATION_MS = "reactgate.tool.duration_ms"


A = Attr
# Each span and the attributes it may carry: the operator's vocabulary, in one place.
SPANS: Final[Mapping[SpanName, frozenset[Attr]]] = {
    SpanName.COMMAND: frozenset({A.CONVERSATION_ID, A.COMMAND, A.COMMAND_ID}),
    SpanName.TURN: frozenset({A.CONVERSATION_ID, A.TURN_ID, A.MESSAGE_ID, A.RESUMED, A.END_REASON}),
    SpanName.ROUND: frozenset({A.CONVERSATION_ID, A.TURN_ID, A.ROUND, A.PHASE, A.ROUND_OUTCOME}),
    SpanName.MODEL_CALL: frozenset({
        A.CONVERSATION_ID, A.TURN_ID, A.ROUND, A.MODEL, A.RESPONSE_MODEL, A.TIME_TO_FIRST_CHUNK_MS, A.CHUNKS,
        A.FALLBACKS, A.FINISH_REASON, A.INPUT_TOKENS, A.OUTPUT_TOKENS, A.ERROR_TYPE,
    }),
    SpanName.TOOL_CALL: frozenset({
        A.CONVERSATION_ID, A.TURN_ID, A.ROUND, A.TOOL_ID, A.CALL_ID, A.TRAIT, A.TOOL_OUTCOME, A.TOOL_DURATION_MS,
    }),
}

_propagator = TraceContextTextMapPropagator()
_tracer: Tracer = trace.NoOpTracer()
_provider: Any = None        # the SDK TracerProvider spans go to; None: tracing is off
_endpoint: str | None = None


# -- the provider ---------------------------------------------------------------------------------


def install(provider: Any) -> None:
    """Send reactgate's spans to `provider` (an SDK TracerProvider), or to nowhere with None.
    `configure` calls it; a test installs one with an in-memory exporter."""
    global _tracer, _provider, _endpoint
    _provider, _endpoint = provider, None
    _tracer = provider.get_tracer(TRACER_NAME) if provider is not None else trace.NoOpTracer()


def active() -> bool:
    return _provider is not None


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of a collector's base URL (as OTEL_EXPORTER_OTLP_ENDPOINT names it)."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def configure(endpoint: str | None, *, service: str) -> None:
    """Export this process's spans over OTLP/HTTP to `endpoint` (a collector's base URL). None:
    nothing is installed, nothing imported. Idempotent per endpoint (a Ray worker may be asked twice)."""
    global _endpoint
    if not endpoint or (active() and _endpoint == endpoint):
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    previous = _provider
    provider = TracerProvider(resource=Resource.create({"service.name": service, "process.pid": os.getpid()}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)), schedule_delay_millis=EXPORT_DELAY_MS)
    )
    install(provider)
    _endpoint = endpoint
    if previous is not None:
        previous.shutdown()


def shutdown() -> None:
    """Flush and stop the installed provider (spans still batched are exported first)."""
    provider = _provider
    install(None)
    if provider is not None:
        provider.shutdown()


# -- across processes ---------------------------------------------------------------------------


def carrier(span: Span | None = None) -> dict[str, str]:
    """`span`'s context (else the current one) as W3C headers in a plain dict: what a command or a
    checkpoint carries to another process. Empty when nothing is traced."""
    if not active():
        return {}
    out: dict[str, str] = {}
    _propagator.inject(out, context=trace.set_span_in_context(span) if span is not None else None)
    return out


def parent(headers: Mapping[str, str] | None) -> Context | None:
    """The context a `carrier` (or a client's `traceparent`) names; None for none or an invalid one."""
    if not headers or not active():
        return None
    context = _propagator.extract(dict(headers))
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def _start(name: SpanName, context: Context | None, attributes: Mapping[Attr, Any]) -> Span:
    # An explicit parent always (an empty Context for a root): no span here is ever made current,
    # so the turn's inner tasks — generation and tool waits a steer cancels — juggle no tokens.
    return _tracer.start_span(name, context=context or Context(), attributes=_checked(name, attributes))


def _set(name: SpanName, span: Span, attributes: Mapping[Attr, Any]) -> None:
    span.set_attributes(_checked(name, attributes))


def _checked(name: SpanName, attributes: Mapping[Attr, Any]) -> dict[str, Any]:
    unknown = set(attributes) - SPANS[name]
    if unknown:
        raise ValueError(f"span {name} carries no {sorted(unknown)} (see SPANS)")
    return {str(k): v for k, v in attributes.items() if v is not None}


# -- the gateway --------------------------------------------------------------------------------


@contextlib.contextmanager
def command(upgrade: Context | None, conversation_id: str, kind: str, command_id: str) -> Iterator[dict[str, str]]:
    """A client command's span, child of the trace its connection's upgrade named (else a root);
    yields its carrier, for the command to take to the conversation's host."""
    if not active():
        yield {}
        return
    span = _start(SpanName.COMMAND, upgrade,
                  {Attr.CONVERSATION_ID: conversation_id, Attr.COMMAND: kind, Attr.COMMAND_ID: command_id})
    try:
        yield carrier(span)
    except BaseException as exc:  # refused (forbidden, a quota) or failed: the frame's error says which
        span.set_status(StatusCode.ERROR, type(exc).__name__)
        raise
    finally:
        span.end()


# -- the host: one turn -------------------------------------------------------------------------


class TurnTrace:
    """One turn's spans: the turn, its current round, the round's model calls and tool calls.
    Off (every method returns at once) unless a provider was installed when the turn started."""

    __slots__ = ("_conversation_id", "_round", "_round_no", "_tools", "_turn", "_turn_id")

    def __init__(self, conversation_id: str, turn_id: str) -> None:
        self._conversation_id = conversation_id
        self._turn_id = turn_id
        self._turn: Span | None = None
        self._round: Span | None = None
        self._round_no = 0
        self._tools: dict[str, Span] = {}

    def _ids(self) -> dict[Attr, Any]:
        return {Attr.CONVERSATION_ID: self._conversation_id, Attr.TURN_ID: self._turn_id}

    def start(self, parent_headers: Mapping[str, str], *, message_id: str, resumed: bool) -> None:
        if not active():
            return
        self._turn = _start(SpanName.TURN, parent(parent_headers),
                            {**self._ids(), Attr.MESSAGE_ID: message_id, Attr.RESUMED: resumed})

    def ended(self, reason: str) -> None:
        if self._turn is not None:
            _set(SpanName.TURN, self._turn, {Attr.END_REASON: reason})

    def end(self) -> None:
        """The turn is over (or its host is stopping): every span still open ends now."""
        for span in self._tools.values():
            span.end()
        self._tools.clear()
        self._end_round()
        if self._turn is not None:
            self._turn.end()
            self._turn = None

    def round(self, round_no: int, phase: str) -> None:
        """Round `round_no` starts; the one before it is over."""
        if self._turn is None:
            return
        self._end_round()
        self._round_no = round_no
        self._round = _start(SpanName.ROUND, trace.set_span_in_context(self._turn),
                             {**self._ids(), Attr.ROUND: round_no, Attr.PHASE: phase})

    def round_outcome(self, outcome: str) -> None:
        if self._round is not None:
            _set(SpanName.ROUND, self._round, {Attr.ROUND_OUTCOME: outcome})

    def _end_round(self) -> None:
        if self._round is not None:
            self._round.end()
            self._round = None

    def _in_round(self) -> Context | None:
        parent_span = self._round or self._turn
        return trace.set_span_in_context(parent_span) if parent_span is not None else None

    def tool_call(self, call_id: str, tool_id: str, trait: str) -> None:
        if self._turn is None:
            return
        self._tools[call_id] = _start(SpanName.TOOL_CALL, self._in_round(), {
            **self._ids(), Attr.ROUND: self._round_no, Attr.TOOL_ID: tool_id, Attr.CALL_ID: call_id,
            Attr.TRAIT: trait,
        })

    def tool_observed(self, call_id: str, error: str | None, duration_ms: int | None) -> None:
        span = self._tools.pop(call_id, None) if self._tools else None
        if span is None:
            return
        _set(SpanName.TOOL_CALL, span, {Attr.TOOL_OUTCOME: error or "ok", Attr.TOOL_DURATION_MS: duration_ms})
        if error is not None:
            span.set_status(StatusCode.ERROR, error)
        span.end()

    def model_call(self, items: AsyncIterator[StreamItem], model: str) -> AsyncIterator[StreamItem]:
        """The call's items, unchanged, inside a span (the turn's stream itself when nothing traces)."""
        if self._turn is None:
            return items
        span = _start(SpanName.MODEL_CALL, self._in_round(),
                      {**self._ids(), Attr.ROUND: self._round_no, Attr.MODEL: model})
        return _traced_call(items, span)


async def _traced_call(items: AsyncIterator[StreamItem], span: Span) -> AsyncIterator[StreamItem]:
    started = time.perf_counter()
    first: float | None = None
    chunks = fallbacks = 0
    finished: ModelFinished | None = None
    try:
        async for item in items:
            if type(item) is ModelDelta:
                chunks += 1
                if first is None:
                    first = time.perf_counter()
            elif type(item) is ModelFinished:
                finished = item
            elif type(item) is ModelFallback:
                fallbacks += 1
            yield item
    except ProviderError as exc:
        _set(SpanName.MODEL_CALL, span, {Attr.ERROR_TYPE: exc.kind})
        span.set_status(StatusCode.ERROR, f"{exc.model}: {exc.kind}")
        raise
    finally:
        try:
            aclose = getattr(items, "aclose", None)
            if aclose is not None:  # closed early (prefix policy, a steer): the provider stream closes now
                await aclose()
        finally:
            usage = finished.usage if finished is not None else None
            _set(SpanName.MODEL_CALL, span, {
                Attr.CHUNKS: chunks, Attr.FALLBACKS: fallbacks,
                Attr.TIME_TO_FIRST_CHUNK_MS: round((first - started) * 1000, 3) if first is not None else None,
                Attr.RESPONSE_MODEL: finished.model if finished is not None else None,
                Attr.FINISH_REASON: finished.finish_reason if finished is not None else None,
                Attr.INPUT_TOKENS: usage.prompt_tokens if usage is not None else None,
                Attr.OUTPUT_TOKENS: usage.completion_tokens if usage is not None else None,
            })
            span.end()
