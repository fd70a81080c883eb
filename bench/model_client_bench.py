"""CPU per streamed chunk of a model call over HTTP: LiteLLM's wrapper, the fast path, bare readers (issue 10).

    .venv/bin/python bench/model_client_bench.py [--chunks 4000] [--paced-chunks 1000] [--repeats 3]

One run, both wire formats, 4-character chunks, the server in another process so that its CPU is
not counted (OpenAI-compatible: `reactgate mock-llm --script F --port 0`; Anthropic Messages: this
script's `--serve-fixtures` mode, playing the test transcript format of tests/fixtures/anthropic_sse.py).
Clients, each a whole call consumed as `stream_model` consumes it:

- litellm:       `litellm.acompletion(stream=True)` in its lean configuration (`lite.LEAN_SETTINGS`),
                 stopped at the finish chunk and closed;
- fast:          `actors.llm.fast.fast_stream` (aiohttp, sans-I/O SSE decoders, msgspec structs);
- floor aiohttp: a bare reader on the same transport: aiohttp `readany`, split at blank lines,
                 one msgspec decode per event, count the text (and the argument fragments, in
                 the native round) — nothing else;
- floor httpx:   the same on httpx (`aiter_raw`), the reader the issue names as the floor.

Four loads: burst (the server writes chunks back to back: many events per socket read), paced (one
chunk per ms: one event per read, the loop wakes per chunk, like one live model stream), 20
paced streams at once (a host with many conversations streaming), and native (docs/design.md#native):
a burst of one native function-calling message — a call whose arguments come in `--chunks`/10
fragments of 4 characters, then a `--chunks`-chunk content answer — served on both wires by the
`--serve-fixtures` process from tests/fixtures/native_sse.py; a chunk there is a content piece or
an argument fragment, and every client counts both. CPU = `time.process_time()` of
this process per delivered chunk, median of `--repeats` alternating repeats; plus CPU per call of a
short (20-chunk) answer, which adds request building. Goals (judged per load): fast ≤ 1.5× the
floor on its transport, and LiteLLM ≥ 8× fast.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import httpx  # noqa: E402
import msgspec  # noqa: E402
from aiohttp import web  # noqa: E402

from actors.llm.call import ModelCall  # noqa: E402
from actors.llm.fast import fast_stream  # noqa: E402
from actors.llm.scripts import CALL_INDEX_HEADER, CONVERSATION_HEADER  # noqa: E402
from actors.llm.transport import aclose_sessions  # noqa: E402
from protocol.deltas import ModelDelta, ToolCallArgs  # noqa: E402
from tests.fixtures.anthropic_sse import serve, transcript_events  # noqa: E402
from tests.fixtures.native_sse import Call, NativeMessage, Text, anthropic_events, openai_events  # noqa: E402

MESSAGES = [{"role": "user", "content": "Tell me about the weather in Paris."}]
FAST_GOAL, LITELLM_GOAL = 1.5, 8.0
CONCURRENT = 20
SHORT = 20
BURST, PACED, SHORT_ROUND, NATIVE = 0, 1, 2, 3   # the rounds the servers play, picked by the call-index header
ROUND_HEADER = CALL_INDEX_HEADER


def answer(chunks: int) -> list[str]:
    words = "rain over the Seine, 12 °C, wind from the west; take an umbrella and a jacket. "
    text = (words * (chunks * 4 // len(words) + 1))[: chunks * 4]
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def native_message(chunks: int) -> NativeMessage:
    """A call with its arguments in `chunks // 10` fragments of 4 characters, then a `chunks`-chunk answer."""
    fragments = max(1, chunks // 10)
    head, tail = '{"city": "Paris", "notes": "', '"}'
    arguments = head + "x" * max(0, fragments * 4 - len(head) - len(tail)) + tail
    pieces = tuple(arguments[i : i + 4] for i in range(0, len(arguments), 4))
    return NativeMessage((Call("call_bench", "demo_weather", pieces), Text(tuple(answer(chunks)))), "tool_calls")


def native_chunks(chunks: int) -> int:
    """What each client counts in the native round: content pieces and argument fragments."""
    return sum(len([piece for piece in part.pieces if piece]) for part in native_message(chunks).parts
               if isinstance(part, Call | Text))


# -- the servers (other processes) ---------------------------------------------------------------


def mock_llm_script(chunks: int, paced_chunks: int) -> dict[str, Any]:
    return {"rounds": [{"deltas": answer(chunks)}, {"deltas": answer(paced_chunks), "delay_ms": 1},
                       {"deltas": answer(SHORT)}]}


def fixture_app(chunks: int, paced_chunks: int) -> web.Application:
    """`/v1/messages`: every round; `/v1/chat/completions`: the native round (mock-llm plays the others)."""
    native = native_message(chunks)
    anthropic = {BURST: (transcript_events(answer(chunks)), 0.0),
                 PACED: (transcript_events(answer(paced_chunks)), 0.001),
                 SHORT_ROUND: (transcript_events(answer(SHORT)), 0.0), NATIVE: (anthropic_events(native), 0.0)}
    openai = {NATIVE: (openai_events(native, usage=(20, chunks)), 0.0)}

    async def play(request: web.Request) -> web.StreamResponse:
        await request.read()
        plays = anthropic if request.path.endswith("/messages") else openai
        events, delay = plays[int(request.headers.get(ROUND_HEADER, "0"))]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in events:
            if delay:
                await asyncio.sleep(delay)
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/messages", play)
    app.router.add_post("/v1/chat/completions", play)
    return app


def serve_fixtures(chunks: int, paced_chunks: int) -> None:
    async def run() -> None:
        runner, port = await serve(fixture_app(chunks, paced_chunks))
        print(f"fixture server at http://127.0.0.1:{port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(run())


def start(command: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if " at http://" not in line:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    return proc, line.split(" at ", 1)[1].split()[0]


# -- the clients ---------------------------------------------------------------------------------


class _Delta(msgspec.Struct, gc=False):
    content: str | None = None


class _Choice(msgspec.Struct, gc=False):
    delta: _Delta | None = None


class _Chunk(msgspec.Struct, gc=False):
    choices: list[_Choice] = []


class _Text(msgspec.Struct, gc=False):
    text: str = ""


class _BlockDelta(msgspec.Struct, gc=False):
    delta: _Text | None = None


# The native round's floor reads argument fragments too: OpenAI's `tool_calls[].function.arguments`,
# Anthropic's `partial_json`.
class _Function(msgspec.Struct, gc=False):
    arguments: str | None = None


class _ToolCall(msgspec.Struct, gc=False):
    function: _Function | None = None


class _NativeDelta(msgspec.Struct, gc=False):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _NativeChoice(msgspec.Struct, gc=False):
    delta: _NativeDelta | None = None


class _NativeChunk(msgspec.Struct, gc=False):
    choices: list[_NativeChoice] = []


class _NativeText(msgspec.Struct, gc=False):
    text: str = ""
    partial_json: str = ""


class _NativeBlockDelta(msgspec.Struct, gc=False):
    delta: _NativeText | None = None


_openai = msgspec.json.Decoder(_Chunk)
_anthropic = msgspec.json.Decoder(_BlockDelta)
_openai_native = msgspec.json.Decoder(_NativeChunk)
_anthropic_native = msgspec.json.Decoder(_NativeBlockDelta)
_BLOCK_DELTA = b"event: content_block_delta\ndata: "


def count_openai(events: list[bytes]) -> int:
    n = 0
    for event in events:
        if event[:7] == b"data: {":
            choices = _openai.decode(event[6:]).choices
            if choices and choices[0].delta is not None and choices[0].delta.content:
                n += 1
    return n


def count_anthropic(events: list[bytes]) -> int:
    n = 0
    for event in events:
        if event[: len(_BLOCK_DELTA)] == _BLOCK_DELTA:
            delta = _anthropic.decode(event[len(_BLOCK_DELTA) :]).delta
            if delta is not None and delta.text:
                n += 1
    return n


def count_openai_native(events: list[bytes]) -> int:
    n = 0
    for event in events:
        if event[:7] == b"data: {":
            choices = _openai_native.decode(event[6:]).choices
            delta = choices[0].delta if choices else None
            if delta is not None:
                if delta.content:
                    n += 1
                for call in delta.tool_calls or ():
                    if call.function is not None and call.function.arguments:
                        n += 1
    return n


def count_anthropic_native(events: list[bytes]) -> int:
    n = 0
    for event in events:
        if event[: len(_BLOCK_DELTA)] == _BLOCK_DELTA:
            delta = _anthropic_native.decode(event[len(_BLOCK_DELTA) :]).delta
            if delta is not None and (delta.text or delta.partial_json):
                n += 1
    return n


@dataclass(frozen=True)
class Target:
    wire: str
    model: str
    api_base: str
    url: str
    headers: dict[str, str]
    body: bytes
    count: Callable[[list[bytes]], int]


def target(wire: str, base: str, *, native: bool = False) -> Target:
    if wire == "openai":
        headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
        body = {"model": "bench", "messages": MESSAGES, "stream": True}
        return Target(wire, "openai/bench", base, f"{base}/chat/completions", headers,
                      json.dumps(body).encode(), count_openai_native if native else count_openai)
    headers = {"x-api-key": "sk-bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    body = {"model": "claude-bench", "max_tokens": 4096, "messages": MESSAGES, "stream": True}
    return Target(wire, "anthropic/claude-bench", base, f"{base}/v1/messages", headers,
                  json.dumps(body).encode(), count_anthropic_native if native else count_anthropic)


def call_headers(round_: int) -> dict[str, str]:
    return {CONVERSATION_HEADER: "bench", ROUND_HEADER: str(round_)}


async def floor_aiohttp(t: Target, round_: int, session: aiohttp.ClientSession) -> int:
    n = 0
    async with session.post(t.url, data=t.body, headers={**t.headers, **call_headers(round_)}) as response:
        tail = b""
        while data := await response.content.readany():
            *events, tail = (tail + data).split(b"\n\n")
            n += t.count(events)
    return n


async def floor_httpx(t: Target, round_: int, client: httpx.AsyncClient) -> int:
    n = 0
    async with client.stream("POST", t.url, content=t.body, headers={**t.headers, **call_headers(round_)}) as response:
        tail = b""
        async for data in response.aiter_raw():
            *events, tail = (tail + data).split(b"\n\n")
            n += t.count(events)
    return n


async def fast(t: Target, round_: int, _: Any) -> int:
    n = 0
    call = ModelCall.resolve(t.model, MESSAGES, {}, conversation_id="bench", call_index=round_, api_base=t.api_base,
                             api_key="sk-bench", max_tokens=4096, include_usage=True)
    async for item in fast_stream(call):
        if type(item) is ModelDelta or type(item) is ToolCallArgs:
            n += 1
    return n


async def litellm_wrapper(t: Target, round_: int, _: Any) -> int:
    from actors.llm.lite import litellm_module

    n = 0
    stream = await litellm_module().acompletion(
        model=t.model, messages=MESSAGES, stream=True, api_base=t.api_base, api_key="sk-bench", max_tokens=4096,
        extra_headers=call_headers(round_), max_retries=0, num_retries=0)
    try:
        async for chunk in stream:
            if chunk.choices:
                delta = chunk.choices[0].delta
                if delta.content:
                    n += 1
                n += sum(1 for call in delta.tool_calls or () if call.function.arguments)
                if chunk.choices[0].finish_reason is not None:
                    break
    finally:
        await stream.aclose()
    return n


Client = Callable[[Target, int, Any], Awaitable[int]]
CLIENTS: dict[str, Client] = {"litellm": litellm_wrapper, "fast": fast, "floor aiohttp": floor_aiohttp,
                              "floor httpx": floor_httpx}
LOADS = {"burst": (BURST, 1), "paced": (PACED, 1), f"paced ×{CONCURRENT}": (PACED, CONCURRENT), "native": (NATIVE, 1)}


async def cpu_per_chunk(client: Client, t: Target, round_: int, streams: int, handle: Any, expected: int) -> float:
    gc.collect()
    start = time.process_time()
    counts = await asyncio.gather(*(client(t, round_, handle) for _ in range(streams)))
    spent = time.process_time() - start
    if any(c != expected for c in counts):
        raise SystemExit(f"{client.__name__} on {t.wire}: {counts[0]} chunks, expected {expected}")
    return spent / sum(counts) * 1e6


async def cpu_per_call(client: Client, t: Target, handle: Any, calls: int = 30) -> float:
    gc.collect()
    start = time.process_time()
    for _ in range(calls):
        await client(t, SHORT_ROUND, handle)
    return (time.process_time() - start) / calls * 1e6


# -- the run -------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


async def run(args: argparse.Namespace, bases: dict[str, tuple[str, str]]) -> int:
    """`bases`: per wire, the server of its text rounds and that of its native round."""
    from actors.llm.lite import LEAN_SETTINGS, litellm_module

    litellm_module()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None))
    handles = {"floor aiohttp": session, "floor httpx": client}
    expected = {BURST: args.chunks, PACED: args.paced_chunks, SHORT_ROUND: SHORT, NATIVE: native_chunks(args.chunks)}
    failures = 0
    try:
        print(f"CPU per chunk (µs, process time of this client; server in another process), 4-char chunks; "
              f"median of {args.repeats}")
        print(f"loads: burst = {args.chunks} chunks back to back; paced = {args.paced_chunks} chunks, 1 ms apart; "
              f"paced ×{CONCURRENT} = {CONCURRENT} such streams at once; native = a call's arguments in "
              f"{max(1, args.chunks // 10)} fragments, then {args.chunks} content chunks, back to back")
        print(f"LiteLLM lean settings: {LEAN_SETTINGS}; stopped at the finish chunk")
        for wire, (base, native_base) in bases.items():
            t, native = target(wire, base), target(wire, native_base, native=True)
            for name, c in CLIENTS.items():   # warm-up: imports, connections, LiteLLM's first-call setup
                await c(t, SHORT_ROUND, handles.get(name))
                await c(native, NATIVE, handles.get(name))
            print(f"\n{wire} ({t.url}; native: {native.url})")
            print(f"  {'load':<12}" + "".join(f"{n:>15}" for n in CLIENTS)
                  + "   fast/floor  litellm/fast  (litellm/floor)")
            for load, (round_, streams) in LOADS.items():
                samples: dict[str, list[float]] = {n: [] for n in CLIENTS}
                for _ in range(args.repeats):
                    for name, c in CLIENTS.items():
                        samples[name].append(await cpu_per_chunk(c, native if round_ == NATIVE else t, round_,
                                                                 streams, handles.get(name), expected[round_]))
                m = {n: statistics.median(v) for n, v in samples.items()}
                fast_floor, lite_fast = m["fast"] / m["floor aiohttp"], m["litellm"] / m["fast"]
                ok = fast_floor <= FAST_GOAL and lite_fast >= LITELLM_GOAL
                failures += not ok
                print(f"  {load:<12}" + "".join(f"{m[n]:>15.1f}" for n in CLIENTS)
                      + f"   {fast_floor:>9.2f}×  {lite_fast:>11.1f}×  ({m['litellm'] / m['floor aiohttp']:>5.1f}×)"
                      + f"   {verdict(ok)}   fast / httpx floor {m['fast'] / m['floor httpx']:.2f}×")
            per_call = {n: statistics.median([await cpu_per_call(c, t, handles.get(n)) for _ in range(args.repeats)])
                        for n, c in CLIENTS.items()}
            print(f"  {'call of ' + str(SHORT):<12}" + "".join(f"{per_call[n]:>15.0f}" for n in CLIENTS)
                  + "   (µs CPU per whole call of a 20-chunk answer, request building included)")
        print(f"\ngoal per load: fast ≤ {FAST_GOAL}× the aiohttp floor (same transport) and LiteLLM ≥ "
              f"{LITELLM_GOAL:g}× fast: {verdict(failures == 0)} ({failures} load(s) failing)")
        print("(litellm/floor) bounds litellm/fast: where the floor itself is less than 8× below LiteLLM — one "
              "paced stream, where every chunk costs a wake-up of the event loop — no client can reach the goal.")
    finally:
        await session.close()
        await client.aclose()
        await aclose_sessions()
    return 0 if failures == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=4000, help="chunks of the burst answer (default 4000)")
    parser.add_argument("--paced-chunks", type=int, default=1000, help="chunks of the paced answer (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats; the median is printed (default 3)")
    parser.add_argument("--serve-fixtures", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fixtures:
        serve_fixtures(args.chunks, args.paced_chunks)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(mock_llm_script(args.chunks, args.paced_chunks)), encoding="utf-8")
        mock, mock_base = start([sys.executable, "-m", "gateway.cli", "mock-llm", "--script", str(script),
                                 "--port", "0"])
        fixtures, fixtures_base = start([sys.executable, __file__, "--serve-fixtures", "--chunks",
                                         str(args.chunks), "--paced-chunks", str(args.paced_chunks)])
        try:
            return asyncio.run(run(args, {"openai": (mock_base, f"{fixtures_base}/v1"),
                                          "anthropic": (fixtures_base, fixtures_base)}))
        finally:
            for proc in (mock, fixtures):
                proc.terminate()
                proc.wait()


if __name__ == "__main__":
    sys.exit(main())
