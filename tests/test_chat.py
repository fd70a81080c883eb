"""`reactgate chat` (SPEC §9): the sans-I/O client core, then the real CLI against a real gateway.

The core (`ChatProtocol`, `Transcript`, `Backoff`) is fed JSON frames and typed lines; the
end-to-end tests run the console script as a subprocess against an in-process `GatewayServer`
on the local backend, and drop its connection mid-turn with a drain (close 1012).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import msgspec
import pytest

from actors.hosting import Backend
from gateway.app import build_backend
from gateway.chat import (
    AnswerDelta,
    AskUser,
    Backoff,
    ChatProtocol,
    ErrorItem,
    Fallback,
    Info,
    NoticeItem,
    Status,
    Step,
    ThinkingDelta,
    ToolCall,
    ToolResult,
    Trace,
    Transcript,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    render_all,
)
from gateway.server import GatewayServer
from gateway.settings import Settings
from protocol.frames import (
    AnswerFrame,
    CancelFrame,
    Open,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    UserMessageFrame,
)

CID = "c_test"
REPO = Path(__file__).resolve().parents[1]
DEMO_ANSWER = "It is raining in Paris, 12 °C. Take an umbrella, and a light jacket would not hurt at that temperature."


def ids() -> Any:
    counter = iter(range(1, 10_000))
    return lambda: f"id{next(counter)}"


def event(seq: int, name: str, **data: Any) -> str:
    return json.dumps({"type": "event", "conversation_id": CID, "seq": seq, "event": name, "data": data, "ts": 0.0})


def ack(frame_id: str, **fields: Any) -> str:
    return json.dumps({"type": "ack", "id": frame_id, "status": fields.pop("status", "accepted"), **fields})


def error(code: str, message: str = "no", **fields: Any) -> str:
    return json.dumps({"type": "error", "code": code, "message": message, **fields})


def ready_protocol(conversation_id: str | None = None, **kwargs: Any) -> tuple[ChatProtocol, Step]:
    """A protocol whose first connection was opened and acked; returns the ack's Step."""
    proto = ChatProtocol(conversation_id, new_id=ids(), **kwargs)
    (open_frame,) = proto.connected().sends
    assert isinstance(open_frame, Open)
    return proto, proto.receive(ack(open_frame.id, conversation_id=CID, last_seq=0))


def feed(proto: ChatProtocol, *frames: str) -> Step:
    step = Step()
    for frame in frames:
        step.extend(proto.receive(frame))
    return step


DEMO_TURN = [
    event(1, "turn.started", turn_id="t1", user_message_id="m1"),
    event(2, "thinking.delta", turn_id="t1", round=1, text="Checking "),
    event(3, "thinking.delta", turn_id="t1", round=1, text="Paris."),
    event(4, "tool.call", turn_id="t1", round=1, call_id="t1.1.0", tool_id="demo.weather",
          params={"city": "Paris"}, trait="exploration"),
    event(5, "round.completed", turn_id="t1", round=1, streamed_state={}, accepted=[], denied=[], notices=[]),
    event(6, "tool.result", turn_id="t1", call_id="t1.1.0", tool_id="demo.weather", ok=True,
          result={"temp_c": 12}, duration_ms=3),
    event(7, "answer.delta", turn_id="t1", round=2, text="It is "),
    event(8, "answer.delta", turn_id="t1", round=2, text="raining."),
    event(9, "turn.completed", turn_id="t1", reason="complete", final_answer="It is raining.",
          used_tools=True, finish_ok=True),
]


# -- opening, subscribing, sending ---------------------------------------------------------------


def test_a_new_connection_opens_and_subscribes_only_after_the_open_ack() -> None:
    proto = ChatProtocol(new_id=ids())
    (frame,) = proto.connected().sends
    assert frame == Open(id="id1")
    step = proto.receive(ack("id1", conversation_id=CID, last_seq=0))
    assert proto.conversation_id == CID and proto.ready
    assert step.sends == [Subscribe(id="id2", conversation_id=CID, after_seq=0)]
    assert Info(f"conversation {CID}") in step.renders


def test_reopening_a_named_conversation_replays_it_from_the_start() -> None:
    proto = ChatProtocol(CID, new_id=ids())
    (frame,) = proto.connected().sends
    assert frame == Open(id="id1", conversation_id=CID)
    step = proto.receive(ack("id1", conversation_id=CID, last_seq=40))
    assert step.sends == [Subscribe(id="id2", conversation_id=CID, after_seq=0)]


def test_agent_and_mode_are_sent_only_with_the_first_open() -> None:
    proto = ChatProtocol(new_id=ids(), agent="demo", mode="ask")
    assert proto.connected().sends == [Open(id="id1", agent="demo", mode="ask")]
    proto.receive(ack("id1", conversation_id=CID, last_seq=0))
    proto.disconnected()
    # The mode is sticky on the server and may have changed since: a re-open never resets it.
    assert proto.connected().sends == [Open(id="id3", conversation_id=CID)]


def test_a_message_typed_before_the_open_ack_is_sent_right_after_it() -> None:
    proto = ChatProtocol(new_id=ids())
    proto.connected()
    assert proto.user_input("hello\n").sends == []
    step = proto.receive(ack("id1", conversation_id=CID, last_seq=0))
    assert step.sends == [
        Subscribe(id="id3", conversation_id=CID, after_seq=0),
        UserMessageFrame(id="id2", conversation_id=CID, text="hello"),
    ]


def test_every_command_gets_a_unique_id() -> None:
    proto, _ = ready_protocol()
    frames = [proto.user_input(text).sends[0] for text in ("a", "b", "/steer c", "/mode ask", "/cancel")]
    assert len({f.id for f in frames}) == len(frames)  # type: ignore[attr-defined]


def test_default_ids_are_uuid_hex() -> None:
    proto = ChatProtocol()
    (frame,) = proto.connected().sends
    assert len(frame.id) == 32 and int(frame.id, 16) >= 0  # type: ignore[attr-defined]


# -- seq tracking: no gap, no duplicate ---------------------------------------------------------


def test_events_render_in_seq_order_and_repeats_are_dropped() -> None:
    proto, _ = ready_protocol()
    first = feed(proto, *DEMO_TURN[:5])
    replay = feed(proto, *DEMO_TURN[:5])  # a restarted subscription replays what we saw
    assert len(first.renders) == 4 and replay.renders == []
    assert proto.duplicates_dropped == 5
    assert proto.last_seq == 5


def test_a_gap_is_never_rendered_and_resubscribes_once_from_the_last_seen_seq() -> None:
    proto, _ = ready_protocol()
    feed(proto, DEMO_TURN[0])
    proto.receive(ack("id2"))  # the first subscription is acked
    step = feed(proto, DEMO_TURN[2], DEMO_TURN[3])  # seq 2 went missing
    assert step.renders == [Status("gap after seq 1 (got 3): re-subscribing")]
    assert step.sends == [Subscribe(id="id3", conversation_id=CID, after_seq=1)]
    assert proto.last_seq == 1
    step = feed(proto, ack("id3"), *DEMO_TURN[1:5])
    assert [type(r) for r in step.renders] == [ThinkingDelta, ThinkingDelta, ToolCall]
    assert proto.last_seq == 5


def test_events_of_another_conversation_are_ignored() -> None:
    proto, _ = ready_protocol()
    other = json.loads(DEMO_TURN[0]) | {"conversation_id": "c_other"}
    assert proto.receive(json.dumps(other)).renders == []
    assert proto.last_seq == 0


def test_slow_consumer_resubscribes_after_the_last_rendered_seq() -> None:
    proto, _ = ready_protocol()
    feed(proto, *DEMO_TURN[:3])
    step = proto.receive(error("slow_consumer", "paused", conversation_id=CID, last_seq=2))
    assert step.sends == [Subscribe(id="id3", conversation_id=CID, after_seq=3)]


# -- reconnect and resume ------------------------------------------------------------------------


def test_reconnect_reopens_the_same_conversation_and_subscribes_after_the_last_seq() -> None:
    proto, _ = ready_protocol()
    feed(proto, *DEMO_TURN[:6])
    proto.disconnected()
    assert not proto.ready
    (frame,) = proto.connected().sends
    assert frame == Open(id="id3", conversation_id=CID)
    step = proto.receive(ack("id3", conversation_id=CID, last_seq=9))
    assert step.sends == [Subscribe(id="id4", conversation_id=CID, after_seq=6)]
    assert Status("reconnected: resuming after seq 6") in step.renders
    rest = feed(proto, *DEMO_TURN)  # the server replays from 7; anything older is dropped
    assert [type(r) for r in rest.renders] == [AnswerDelta, AnswerDelta, TurnCompleted]


def test_an_unacked_message_is_resent_with_the_same_id_after_a_reconnect() -> None:
    proto, _ = ready_protocol()
    (sent,) = proto.user_input("weather?").sends
    proto.disconnected()
    proto.connected()
    step = proto.receive(ack("id4", conversation_id=CID, last_seq=0))
    assert sent in step.sends  # same id: the server acks the repeat `duplicate` and does nothing
    proto.receive(ack(sent.id, status="duplicate"))  # type: ignore[attr-defined]
    proto.disconnected()
    proto.connected()
    assert all(not isinstance(f, UserMessageFrame) for f in proto.receive(ack("id6", conversation_id=CID)).sends)


def test_an_unacked_cancel_is_not_resent_because_it_is_not_idempotent() -> None:
    proto, _ = ready_protocol()
    proto.user_input("/cancel")
    step = proto.disconnected()
    assert step.renders == [Status("cancel may not have reached the server: send it again")]
    proto.connected()
    assert all(not isinstance(f, CancelFrame) for f in proto.receive(ack("id4", conversation_id=CID)).sends)


def test_an_error_for_a_command_drops_it_from_the_resend_list() -> None:
    proto, _ = ready_protocol()
    (sent,) = proto.user_input("x").sends
    step = proto.receive(error("rate_limited", "slow down", id=sent.id))  # type: ignore[attr-defined]
    assert step.renders == [ErrorItem("rate_limited", "slow down")]
    assert proto.pending == {}


def test_open_refused_is_fatal() -> None:
    proto = ChatProtocol(CID, new_id=ids())
    proto.connected()
    assert proto.receive(error("forbidden", "forbidden: no such conversation", id="id1")).fatal


# -- the render model ----------------------------------------------------------------------------


def test_events_become_render_items() -> None:
    proto, _ = ready_protocol()
    step = feed(proto, *DEMO_TURN)
    assert step.renders == [
        TurnStarted("t1", "m1"),
        ThinkingDelta("t1", 1, "Checking "),
        ThinkingDelta("t1", 1, "Paris."),
        ToolCall("t1.1.0", "demo.weather", {"city": "Paris"}, "exploration"),
        ToolResult("t1.1.0", "demo.weather", True, {"temp_c": 12}, None, 3),
        AnswerDelta("t1", "It is "),
        AnswerDelta("t1", "raining."),
        TurnCompleted("t1", "complete", True, True),
    ]


def test_notices_ui_commands_fallbacks_and_traces_are_rendered() -> None:
    proto, _ = ready_protocol()
    notice = {"code": "finish.illegal", "message": "observe first", "index": 0, "violations": ["no observation"]}
    step = feed(
        proto,
        event(1, "fallback", **{"from": "a", "to": "b", "error": "rate_limit"}),
        event(2, "round.completed", turn_id="t1", round=1, notices=[notice]),
        event(3, "ui_command", turn_id="t1", command="open_tab", args={"name": "x"}),
        event(4, "trace", kind="salvaged", turn_id="t1"),
        event(5, "trace", kind="illegal_finish", turn_id="t1", events=[]),
    )
    assert step.renders == [
        Fallback("a", "b", "rate_limit"),
        NoticeItem("finish.illegal", "observe first", None, ("no observation",)),
        UiCommand("open_tab", {"name": "x"}),
        Trace("salvaged"),
    ]


def test_a_final_answer_that_never_streamed_is_shown_once() -> None:
    proto, _ = ready_protocol()
    step = feed(
        proto,
        event(1, "turn.started", turn_id="t1", user_message_id="m"),
        event(2, "turn.completed", turn_id="t1", reason="protocol_violation", final_answer="Sorry.",
              used_tools=False, finish_ok=False),
    )
    assert AnswerDelta("t1", "Sorry.") in step.renders


def test_a_streamed_final_answer_is_not_repeated() -> None:
    proto, _ = ready_protocol()
    step = feed(proto, *DEMO_TURN)
    assert "".join(r.text for r in step.renders if isinstance(r, AnswerDelta)) == "It is raining."


def test_message_mode_is_done_when_its_own_turn_completes() -> None:
    proto = ChatProtocol(new_id=ids())
    proto.send_message("weather?", await_turn=True)  # id1, queued until the open ack
    (open_frame,) = proto.connected().sends
    proto.receive(ack(open_frame.id, conversation_id=CID, last_seq=0))
    earlier = [
        event(1, "turn.started", turn_id="t0", user_message_id="someone-else"),
        event(2, "turn.completed", turn_id="t0", reason="complete", final_answer="x"),
    ]
    assert not feed(proto, *earlier).done
    mine = [
        event(3, "turn.started", turn_id="t1", user_message_id="id1"),
        event(4, "turn.completed", turn_id="t1", reason="complete", final_answer="y"),
    ]
    assert feed(proto, *mine).done


# -- ask_user and commands at the prompt ---------------------------------------------------------


def ask_event(seq: int = 1) -> str:
    return event(seq, "ask_user", turn_id="t1", ask_id="t1.1.0", question="Which city?",
                 options=["Paris", "Oslo"], timeout_s=300)


def test_ask_user_is_rendered_with_its_options() -> None:
    proto, _ = ready_protocol()
    step = proto.receive(ask_event())
    assert step.renders == [AskUser("t1.1.0", "Which city?", ("Paris", "Oslo"), 300)]
    assert "  1. Paris\n  2. Oslo\n" in render_all(step.renders)


@pytest.mark.parametrize(("typed", "answer"), [("2", "Oslo"), ("1", "Paris"), ("Bergen", "Bergen"), ("7", "7")])
def test_the_next_line_answers_the_question_and_carries_the_ask_id(typed: str, answer: str) -> None:
    proto, _ = ready_protocol()
    proto.receive(ask_event())
    (frame,) = proto.user_input(typed).sends
    assert isinstance(frame, AnswerFrame)
    assert (frame.ask_id, frame.answer, frame.conversation_id) == ("t1.1.0", answer, CID)
    assert isinstance(proto.user_input("next").sends[0], UserMessageFrame)  # the question was answered


def test_a_question_answered_elsewhere_no_longer_takes_the_next_line() -> None:
    proto, _ = ready_protocol()
    feed(proto, ask_event(1), event(2, "tool.result", turn_id="t1", call_id="t1.1.0", tool_id="react.ask_user",
                                    ok=True, result={"answer": "Paris"}))
    assert isinstance(proto.user_input("hello").sends[0], UserMessageFrame)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("/mode ask", SetModeFrame(id="id3", conversation_id=CID, mode="ask")),
        ("/mode agent", SetModeFrame(id="id3", conversation_id=CID, mode="agent")),
        ("/steer only Paris", SteerFrame(id="id3", conversation_id=CID, text="only Paris")),
        ("/cancel", CancelFrame(id="id3", conversation_id=CID)),
        ("//slash text", UserMessageFrame(id="id3", conversation_id=CID, text="/slash text")),
        ("plain text", UserMessageFrame(id="id3", conversation_id=CID, text="plain text")),
    ],
)
def test_prompt_lines_become_frames(line: str, expected: msgspec.Struct) -> None:
    proto, _ = ready_protocol()
    assert proto.user_input(line).sends == [expected]


@pytest.mark.parametrize("line", ["/mode", "/mode fast", "/steer", "/nope"])
def test_bad_commands_are_local_errors(line: str) -> None:
    proto, _ = ready_protocol()
    step = proto.user_input(line)
    assert step.sends == [] and isinstance(step.renders[0], ErrorItem)


def test_quit_and_blank_lines() -> None:
    proto, _ = ready_protocol()
    assert proto.user_input("/quit").quit
    assert proto.user_input("   \n") == Step()


def test_an_acked_mode_change_is_confirmed() -> None:
    proto, _ = ready_protocol()
    (frame,) = proto.user_input("/mode ask").sends
    assert proto.receive(ack(frame.id)).renders == [Info("mode ask (accepted)")]  # type: ignore[attr-defined]


# -- the transcript ------------------------------------------------------------------------------


def test_transcript_streams_inline_and_breaks_lines_between_lanes() -> None:
    proto, _ = ready_protocol()
    text = render_all(feed(proto, *DEMO_TURN).renders)
    assert text == (
        "thinking: Checking Paris.\n"
        '→ demo.weather {"city":"Paris"} [exploration]\n'
        '← demo.weather ok 3 ms {"temp_c":12}\n'
        "It is raining.\n"
        "✓ turn t1 complete\n"
    )


def test_a_resumed_answer_continues_on_the_same_line() -> None:
    transcript = Transcript()
    parts = [transcript.segments(AnswerDelta("t1", "It is ")), transcript.segments(Status("reconnected")),
             transcript.segments(AnswerDelta("t1", "raining."))]
    assert "".join(t for seg in parts for t, _ in seg) == "It is raining."


def test_tool_errors_and_notices_are_one_line_each() -> None:
    text = render_all([
        ToolResult("c", "demo.fail", False, None, {"error": "boom"}, 1),
        NoticeItem("ASK_MODE_DENIED", "write tools are off in ask mode", "demo.write_note"),
        TurnCompleted("t2", "cancelled", None, False),
    ])
    assert text == (
        '← demo.fail error 1 ms {"error":"boom"}\n'
        "notice ASK_MODE_DENIED [demo.write_note]: write tools are off in ask mode\n"
        "! turn t2 cancelled, finish not ok\n"
    )


# -- the backoff schedule ------------------------------------------------------------------------


def test_backoff_bound_doubles_from_base_to_cap() -> None:
    backoff = Backoff(base_s=0.2, cap_s=5.0, rng=lambda: 1.0)
    delays = [backoff.next_delay() for _ in range(8)]
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0])


def test_backoff_is_full_jitter_within_bounds() -> None:
    rng = random.Random(7)
    backoff = Backoff(rng=rng.random)
    for attempt in range(200):
        delay = backoff.next_delay()
        assert 0.0 <= delay <= min(5.0, 0.2 * 2**attempt)
    assert Backoff(rng=lambda: 0.0).next_delay() == 0.0


def test_backoff_resets_after_a_good_connection() -> None:
    backoff = Backoff(rng=lambda: 1.0)
    for _ in range(5):
        backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == pytest.approx(0.2)


def test_backoff_survives_very_long_outages() -> None:
    backoff = Backoff(rng=lambda: 1.0, attempt=10_000)
    assert backoff.next_delay() == 5.0


# -- end to end: the CLI against a real gateway --------------------------------------------------


def chat_command() -> list[str]:
    script = Path(sys.executable).with_name("reactgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]


def chat_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "REACTGATE_TOKEN")}
    return env | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "TERM": "dumb"}


class SharedBackend:
    """One backend behind successive gateways, as conversation hosts outlive a drained gateway
    replica in a cluster: the gateway's start/stop do not reach it; the test stops it."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.started = False

    async def start(self) -> None:
        if not self.started:
            self.started = True
            await self.inner.start()

    async def stop(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class ChatRun:
    proc: asyncio.subprocess.Process
    stdout: str = ""
    stderr: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def exit_code(self, timeout: float = 60) -> int:
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            pytest.fail(f"chat still running after {timeout} s:\n{self.stdout}\n{self.stderr}")

    async def wait_for_output(self, text: str, timeout: float = 60) -> None:
        async def wait() -> None:
            while text not in self.stdout:
                if self.proc.returncode is not None:
                    pytest.fail(f"chat exited {self.proc.returncode} before {text!r}:\n{self.stdout}\n{self.stderr}")
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)


@contextlib.asynccontextmanager
async def chat(*args: str, env: dict[str, str] | None = None) -> AsyncIterator[ChatRun]:
    proc = await asyncio.create_subprocess_exec(
        *chat_command(), "chat", *args, cwd=REPO, env=chat_env() | (env or {}),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    run = ChatRun(proc)

    async def pump(stream: asyncio.StreamReader | None, name: str) -> None:
        assert stream is not None
        while chunk := await stream.read(256):
            setattr(run, name, getattr(run, name) + chunk.decode(errors="replace"))
            run.changed.set()
        run.changed.set()

    pumps = [asyncio.create_task(pump(proc.stdout, "stdout")), asyncio.create_task(pump(proc.stderr, "stderr"))]
    try:
        yield run
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
        await asyncio.gather(*pumps)


@contextlib.asynccontextmanager
async def gateway(backend: Backend, port: int = 0, **settings: Any) -> AsyncIterator[tuple[GatewayServer, int]]:
    server = GatewayServer(Settings(host="127.0.0.1", port=port, backend="local", **settings), backend)
    _, bound = await server.start()
    try:
        yield server, bound
    finally:
        await server.drain()


def local_backend(tmp_path: Path) -> Backend:
    return build_backend(Settings(backend="local", port=0, store=f"sqlite:///{tmp_path}/chat.sqlite3"))


@pytest.mark.slow
async def test_chat_message_prints_the_streamed_turn_and_exits_0(tmp_path: Path) -> None:
    async with gateway(local_backend(tmp_path)) as (_, port), chat(
        "--message", "weather in Paris?", "--url", f"ws://127.0.0.1:{port}/ws"
    ) as run:
        assert await run.exit_code(120) == 0, run.stderr
        await run.wait_for_output("✓ turn")
    out = run.stdout
    assert out.startswith("conversation c_")
    assert "thinking: Checking the weather in Paris." in out
    assert '→ demo.weather {"city":"Paris"} [exploration]' in out
    assert '← demo.weather ok' in out and '"condition":"rain"' in out
    assert out.count(DEMO_ANSWER) == 1
    assert "✓ turn t1 complete" in out
    assert "\x1b[" not in out  # no terminal codes when stdout is not a terminal


@pytest.mark.slow
async def test_chat_resumes_across_a_gateway_drain_and_prints_the_answer_exactly_once(tmp_path: Path) -> None:
    backend = SharedBackend(local_backend(tmp_path))
    try:
        async with gateway(backend) as (first, port):
            url = f"ws://127.0.0.1:{port}/ws"
            async with chat("--message", "weather in Paris?", "--url", url) as run:
                await run.wait_for_output("It is", timeout=120)  # the answer is streaming
                await first.drain()                              # clients get 1012, the turn goes on
                await asyncio.sleep(0.3)                         # a reconnect attempt or two is refused
                async with gateway(backend, port):               # a fresh gateway on the same port
                    assert await run.exit_code() == 0, run.stderr
                    await run.wait_for_output("✓ turn")
    finally:
        await backend.inner.stop()
    assert "1012" in run.stderr and "reconnected: resuming after seq" in run.stderr
    assert run.stdout.count(DEMO_ANSWER) == 1
    assert run.stdout.count("It is") == 1
    assert run.stdout.count("thinking: Paris reports rain") == 1
    assert run.stdout.count("→ demo.weather") == 1


@pytest.mark.slow
@pytest.mark.parametrize("cut_at", ["thinking: Paris reports", "It is"], ids=["before-answer", "mid-answer"])
async def test_chat_resumes_after_the_whole_server_drains_and_restarts_on_the_same_store(
    tmp_path: Path, cut_at: str
) -> None:
    """Local backend: the drain stops the conversation mid-turn; a fresh server on the same store
    and port re-activates it (SPEC §5 Faults: salvage if the answer streamed, else re-decide) and
    the client, re-subscribed after its last seq, prints the rest of the turn once."""
    async with gateway(local_backend(tmp_path)) as (first, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "weather in Paris?", "--url", url) as run:
            await run.wait_for_output(cut_at, timeout=120)
            await first.drain()
            async with gateway(local_backend(tmp_path), port):
                assert await run.exit_code() == 0, run.stderr
    assert "1012" in run.stderr and "reconnected: resuming after seq" in run.stderr
    answers = [line for line in run.stdout.splitlines() if line.startswith("It is")]
    assert len(answers) == 1, run.stdout
    if "✓ turn t1 complete" in run.stdout:
        assert answers == [DEMO_ANSWER]
    else:  # the answer had started streaming: the user keeps exactly what they saw
        assert "! turn t1 salvaged" in run.stdout, run.stdout
        assert DEMO_ANSWER.startswith(answers[0])


@pytest.mark.slow
async def test_chat_gives_up_with_exit_2_on_a_refused_handshake(tmp_path: Path) -> None:
    async with gateway(local_backend(tmp_path)) as (_, port), chat(
        "--message", "hi", "--url", f"ws://127.0.0.1:{port}/nope"
    ) as run:
        assert await run.exit_code() == 2
    assert "HTTP 404" in run.stderr


@pytest.mark.slow
async def test_chat_authenticates_with_the_token_from_the_environment(tmp_path: Path) -> None:
    secret = "chat-test-secret-for-hs256-at-least-32-bytes"
    token = jwt.encode({"sub": "alice", "tenant": "acme", "exp": int(time.time()) + 600}, secret, algorithm="HS256")
    async with gateway(local_backend(tmp_path), auth_secret=secret) as (_, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "hi", "--url", url) as refused:
            assert await refused.exit_code() == 2
        assert "HTTP 401" in refused.stderr
        async with chat("--message", "weather in Paris?", "--url", url, env={"REACTGATE_TOKEN": token}) as run:
            assert await run.exit_code(120) == 0, run.stderr
    assert run.stdout.count(DEMO_ANSWER) == 1
