"""Tracing (docs/design.md#tracing): one user message is one trace — the client's `traceparent` on the
WebSocket upgrade, the gateway's command span, then on the host the turn, its rounds, each round's
model call and tool calls — over the local backend (one process) and the Ray backend (the hosts'
spans reach a loopback OTLP/HTTP collector from their own processes). Without a provider nothing is
traced and the model stream is not even wrapped."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.server
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from websockets.asyncio.client import connect

from actors import tracing
from actors.conversation import ConversationState, QueuedMessage
from actors.tracing import SPANS, SpanName, TurnTrace
from actors.turn_machine import TurnProgress
from gateway.app import otlp_endpoint
from gateway.settings import Settings
from tests.e2e import RayHosting, local_server, ray_hosting, ray_server, weather_then_answer
from tests.kit import PROTO, TIMEOUT, Client, wait_until

REPO = Path(__file__).resolve().parents[1]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"


# -- what each span carries ---------------------------------------------------------------------


def test_the_span_table_names_what_each_span_carries() -> None:
    assert {name.value: sorted(a.value for a in attrs) for name, attrs in SPANS.items()} == {
        "reactgate.command": ["reactgate.command", "reactgate.command_id", "reactgate.conversation_id"],
        "reactgate.turn": ["reactgate.conversation_id", "reactgate.message_id", "reactgate.turn.end_reason",
                           "reactgate.turn.resumed", "reactgate.turn_id"],
        "reactgate.round": ["reactgate.conversation_id", "reactgate.round", "reactgate.round.outcome",
                            "reactgate.round.phase", "reactgate.turn_id"],
        "reactgate.model_call": [
            "error.type", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens", "reactgate.conversation_id", "reactgate.model.chunks",
            "reactgate.model.fallbacks", "reactgate.model.finish_reason",
            "reactgate.model.time_to_first_chunk_ms", "reactgate.round", "reactgate.turn_id",
        ],
        "reactgate.tool_call": ["reactgate.conversation_id", "reactgate.round", "reactgate.tool.call_id",
                                "reactgate.tool.duration_ms", "reactgate.tool.id", "reactgate.tool.outcome",
                                "reactgate.tool.trait", "reactgate.turn_id"],
    }


# -- no provider: no cost -----------------------------------------------------------------------


async def test_without_a_provider_the_model_stream_is_not_wrapped_and_nothing_is_carried() -> None:
    tracing.install(None)

    async def items() -> AsyncIterator[Any]:
        yield None

    stream = items()
    turn = TurnTrace("c_1", "t1")
    turn.start({"traceparent": TRACEPARENT}, message_id="m1", resumed=False)
    turn.round(1, "decision")
    assert turn.model_call(stream, "scripted/x") is stream   # the per-delta path is the bare stream
    assert tracing.carrier() == {}
    with tracing.command(None, "c_1", "user_message", "f1") as carried:
        assert carried == {}
    await stream.aclose()


def test_no_endpoint_imports_no_exporter_and_installs_no_provider() -> None:
    code = (
        "import sys\n"
        "from actors import tracing\n"
        "from gateway.app import otlp_endpoint\n"
        "from gateway.settings import Settings\n"
        "tracing.configure(otlp_endpoint(Settings()), service='reactgate-gateway')\n"
        "assert not tracing.active()\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.exporter.otlp')], 'exporter imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REACTGATE_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_endpoint_is_reactgate_otlp_endpoint_else_the_standard_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REACTGATE_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert otlp_endpoint(Settings()) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert otlp_endpoint(Settings()) == "http://collector:4318"
    monkeypatch.setenv("REACTGATE_OTLP_ENDPOINT", "http://ours:4318")
    assert otlp_endpoint(Settings()) == "http://ours:4318"
    assert tracing.traces_url("http://ours:4318/") == "http://ours:4318/v1/traces"
    assert tracing.traces_url("http://ours:4318/v1/traces") == "http://ours:4318/v1/traces"


# -- the trace survives a checkpoint ------------------------------------------------------------


def test_a_queued_message_and_a_running_turn_keep_their_trace_in_the_snapshot() -> None:
    carried = {"traceparent": TRACEPARENT}
    state = ConversationState(conversation_id="c_1", agent="demo", queue=[QueuedMessage("m2", "later", carried)],
                              current=TurnProgress(turn_id="t1", message_id="m1", text="now", trace=carried))
    again = ConversationState.decode(state.encode())
    assert again.queue[0].trace == carried and again.current is not None and again.current.trace == carried
    # A snapshot written before traces were kept decodes with none.
    old = msgspec.msgpack.encode({"conversation_id": "c_1", "agent": "demo",
                                  "queue": [{"message_id": "m2", "text": "later"}],
                                  "current": {"turn_id": "t1", "message_id": "m1", "text": "now"}})
    decoded = ConversationState.decode(old)
    assert decoded.queue[0].trace == {} and decoded.current is not None and decoded.current.trace == {}


# -- a loopback OTLP/HTTP collector -------------------------------------------------------------


@dataclass(frozen=True)
class Collected:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    service: str
    pid: int


class Collector:
    """Accepts OTLP/HTTP protobuf exports on 127.0.0.1 and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[Collected] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                collector._keep(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    with self._lock:
                        self.spans.append(Collected(
                            span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in span.attributes},
                            str(resource.get("service.name")), int(resource.get("process.pid", 0)),
                        ))

    def named(self, name: SpanName) -> list[Collected]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    @contextlib.contextmanager
    def running(self) -> Iterator[Collector]:
        self._thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


def test_configure_exports_this_process_spans_over_otlp_http() -> None:
    with Collector().running() as collector:
        tracing.configure(collector.url, service="reactgate-gateway")
        try:
            assert tracing.active()
            with tracing.command(None, "c_1", "user_message", "f1") as carried:
                assert carried["traceparent"].startswith("00-")
        finally:
            tracing.shutdown()  # flushes the batch
        [span] = collector.named(SpanName.COMMAND)
        assert (span.service, span.pid) == ("reactgate-gateway", os.getpid())
        assert span.attributes == {"reactgate.conversation_id": "c_1", "reactgate.command": "user_message",
                                   "reactgate.command_id": "f1"}
        assert carried["traceparent"].startswith(f"00-{span.trace_id}-{span.span_id}-")  # what a host continues
    assert not tracing.active()


# -- one turn, one trace ------------------------------------------------------------------------


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(provider)
    try:
        yield memory
    finally:
        tracing.install(None)
        provider.shutdown()


async def one_traced_turn(url: str) -> str:
    """Open a conversation on a connection whose upgrade carries TRACEPARENT, and run the demo turn
    (demo.weather, then the answer). Returns the conversation id."""
    async with connect(url, subprotocols=PROTO, additional_headers={"traceparent": TRACEPARENT},
                       open_timeout=TIMEOUT) as ws:
        c = Client(ws)
        cid = await c.open()
        await c.subscribe(cid)
        assert (await c.say(cid))["status"] == "accepted"
        done = await c.turn_completed(cid)
        assert done["data"]["reason"] == "complete", done
        return cid


def _hex(span: ReadableSpan, parent: bool = False) -> str:
    context = span.parent if parent else span.context
    assert context is not None, span.name
    return f"{context.span_id:016x}"


def check_turn_tree(spans: Sequence[Any], cid: str, command_span_id: str,
                    span_id: Any, parent_id: Any, attrs: Any) -> None:
    """turn → rounds → one model call each; round 1 → the tool call: ids, chunks, trait, outcome."""
    [turn] = [s for s in spans if s.name == SpanName.TURN]
    rounds = sorted((s for s in spans if s.name == SpanName.ROUND), key=lambda s: attrs(s)["reactgate.round"])
    models = [s for s in spans if s.name == SpanName.MODEL_CALL]
    [tool] = [s for s in spans if s.name == SpanName.TOOL_CALL]
    assert parent_id(turn) == command_span_id
    assert attrs(turn) == {"reactgate.conversation_id": cid, "reactgate.turn_id": "t1",
                           "reactgate.message_id": attrs(turn)["reactgate.message_id"],
                           "reactgate.turn.resumed": False, "reactgate.turn.end_reason": "complete"}
    assert [attrs(r)["reactgate.round"] for r in rounds] == [1, 2]
    assert [attrs(r)["reactgate.round.outcome"] for r in rounds] == ["tools", "finish"]
    assert all(parent_id(r) == span_id(turn) for r in rounds)
    assert sorted(parent_id(m) for m in models) == sorted(span_id(r) for r in rounds)  # one per round
    for model in models:
        a = attrs(model)
        assert a["reactgate.model.chunks"] > 0 and a["reactgate.model.time_to_first_chunk_ms"] >= 0
        assert a["gen_ai.request.model"].startswith("scripted/")
        assert a["reactgate.model.finish_reason"] == "stop"
    assert parent_id(tool) == span_id(rounds[0])
    assert attrs(tool)["reactgate.tool.id"] == "demo.weather"
    assert attrs(tool)["reactgate.tool.trait"] == "exploration"
    assert attrs(tool)["reactgate.tool.outcome"] == "ok"
    for span in [turn, *rounds, *models, tool]:
        assert attrs(span)["reactgate.conversation_id"] == cid and attrs(span)["reactgate.turn_id"] == "t1"
        assert set(attrs(span)) <= {a.value for a in SPANS[SpanName(span.name)]}


async def test_one_turn_over_the_local_backend_is_one_trace(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    async with local_server(tmp_path / "store.sqlite3", weather_then_answer()) as server:
        cid = await one_traced_turn(server.url)
        await wait_until(lambda: any(s.name == SpanName.TURN for s in exporter.get_finished_spans()))
    spans = exporter.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in spans} == {TRACE_ID}
    [command] = [s for s in spans if s.name == SpanName.COMMAND]
    assert _hex(command, parent=True) == CLIENT_SPAN_ID        # the client's span, from the upgrade
    assert dict(command.attributes or {})["reactgate.command"] == "user_message"
    check_turn_tree(spans, cid, _hex(command), _hex, lambda s: _hex(s, parent=True),
                    lambda s: dict(s.attributes or {}))


# -- across processes: the Ray backend ----------------------------------------------------------


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    with Collector().running() as running:
        yield running


@pytest.fixture(scope="module")
def traced_ray(tmp_path_factory: pytest.TempPathFactory, collector: Collector) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": weather_then_answer()}) as hosting:
        # What gateway/app.py's ray_config does with REACTGATE_OTLP_ENDPOINT: the hosts export there.
        yield RayHosting(dataclasses.replace(hosting.config, otlp_endpoint=collector.url), hosting.default_agent)


@pytest.mark.ray
async def test_one_turn_over_the_ray_backend_is_one_trace_across_processes(
    traced_ray: RayHosting, collector: Collector, exporter: InMemorySpanExporter
) -> None:
    async with ray_server(traced_ray) as server:
        cid = await one_traced_turn(server.url)
    [command] = [s for s in exporter.get_finished_spans()
                 if s.name == SpanName.COMMAND and dict(s.attributes or {})["reactgate.command"] == "user_message"]
    assert f"{command.context.trace_id:032x}" == TRACE_ID and _hex(command, parent=True) == CLIENT_SPAN_ID
    # The host exports in batches (tracing.EXPORT_DELAY_MS): wait for its turn's spans to arrive.
    await wait_until(lambda: len(collector.named(SpanName.TURN)) == 1 and len(collector.named(SpanName.ROUND)) == 2
                     and len(collector.named(SpanName.MODEL_CALL)) == 2, timeout=30)
    hosted = [s for s in collector.spans if s.trace_id == TRACE_ID]
    assert {s.name for s in collector.spans if s not in hosted} == set()  # nothing outside the client's trace
    assert {(s.service, s.pid == os.getpid()) for s in hosted} == {("reactgate-host", False)}
    check_turn_tree(hosted, cid, _hex(command), lambda s: s.span_id, lambda s: s.parent_id, lambda s: s.attributes)
