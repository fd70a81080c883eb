"""`reactgate chat` (README.md#configuration): the chat on the client session, then the real CLI
against a real gateway.

The core (`Chat`, `Transcript`, `Backoff`) is fed typed frames and typed lines, with the session's
frames collected as the connection would send them; the end-to-end tests run the console script as
a subprocess against an in-process `GatewayServer` on the local backend, and drop its connection
mid-turn with a drain (close 1012).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import pytest

from actors.hosting.backend import Backend
from client.chat import (
    CONFIRM_DELETE,
    Chat,
    Info,
    Problem,
    Save,
    Status,
    Step,
    Transcript,
    render_all,
    turn_exit_code,
    write_export,
)
from client.connection import Backoff, ConnectionLost
from client.resume import LastConversations, come_back, state_path
from client.session import ClientSession, Send
from gateway.app import build_backend
from gateway.server import GatewayServer
from gateway.settings import Settings
from protocol.events import (
    NOTHING_STREAMED,
    AcceptedAction,
    AnswerDelta,
    AskUser,
    EndReason,
    Event,
    EventData,
    Fallback,
    IllegalFinish,
    Lane,
    MessageKind,
    RoundCompleted,
    Salvaged,
    StreamedState,
    ThinkingDelta,
    ToolCalled,
    ToolResult,
    TurnCompleted,
    TurnStarted,
    UiCommand,
    UserSaid,
)
from protocol.frames import (
    Ack,
    AnswerFrame,
    CancelFrame,
    ClientFrame,
    DeleteFrame,
    ErrorCode,
    ErrorFrame,
    ExportCompleted,
    ExportFrame,
    Mode,
    Open,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    UserMessageFrame,
    encode_event,
    encode_frame,
)
from protocol.notices import Notice, NoticeCode

CID = "c_test"
REPO = Path(__file__).resolve().parents[1]
DEMO_ANSWER = "It is raining in Paris, 12 °C. Take an umbrella, and a light jacket would not hurt at that temperature."


def ids() -> Callable[[], str]:
    counter = iter(range(1, 10_000))
    return lambda: f"id{next(counter)}"


def event(seq: int, data: EventData | dict[str, Any], name: str | None = None) -> bytes:
    if isinstance(data, dict):  # a kind this version does not know
        assert name is not None
        return encode_event(Event(conversation_id=CID, seq=seq, event=name, data=data, ts=0.0))
    return encode_event(Event.of(CID, seq, data, 0.0))


def ack(frame_id: str, **fields: Any) -> bytes:
    return encode_frame(Ack(id=frame_id, status=fields.pop("status", "accepted"), **fields))


def error(code: ErrorCode, message: str = "no", **fields: Any) -> bytes:
    return encode_frame(ErrorFrame(code=code, message=message, **fields))


def shown(data: EventData, seq: int = 1) -> Event:
    return Event.of(CID, seq, data, 0.0)


def round_completed(notices: list[Notice] | None = None, turn_id: str = "t1") -> RoundCompleted:
    return RoundCompleted(turn_id=turn_id, round=1, streamed_state=NOTHING_STREAMED, accepted=[], denied=[],
                          notices=notices or [])


def completed(turn_id: str = "t1", reason: EndReason = EndReason.COMPLETE, final_answer: str = "", *,
              used_tools: bool = True, finish_ok: bool = True) -> TurnCompleted:
    return TurnCompleted(turn_id=turn_id, reason=reason, final_answer=final_answer, used_tools=used_tools,
                         finish_ok=finish_ok)


# -- playing the connection's part: the session's frames are collected, the rest goes to the chat


def pump(chat: Chat) -> tuple[list[ClientFrame], Step]:
    sends: list[ClientFrame] = []
    step = Step()
    for output in chat.session.outputs():
        if isinstance(output, Send):
            sends.append(output.frame)
        else:
            step.extend(chat.on_output(output))
    return sends, step


def receive(chat: Chat, *frames: bytes) -> tuple[list[ClientFrame], Step]:
    for frame in frames:
        chat.session.receive(frame)
    return pump(chat)


def typed(chat: Chat, line: str) -> tuple[list[ClientFrame], Step]:
    step = chat.user_input(line)
    sends, more = pump(chat)
    return sends, step.extend(more)


def connect(chat: Chat) -> Open:
    chat.session.connected()
    (frame,), _ = pump(chat)
    assert isinstance(frame, Open)
    return frame


def new_chat(conversation_id: str | None = None, **kwargs: Any) -> Chat:
    return Chat(ClientSession(conversation_id, new_id=ids(), **kwargs))


def ready_chat(conversation_id: str | None = None, **kwargs: Any) -> tuple[Chat, Step]:
    """A chat whose first connection was opened and acked; returns the ack's Step."""
    chat = new_chat(conversation_id, **kwargs)
    open_frame = connect(chat)
    _, step = receive(chat, ack(open_frame.id, conversation_id=CID, last_seq=0))
    return chat, step


DEMO_DATA: list[EventData] = [
    TurnStarted(turn_id="t1", user_message_id="m1"),
    ThinkingDelta(turn_id="t1", round=1, text="Checking "),
    ThinkingDelta(turn_id="t1", round=1, text="Paris."),
    ToolCalled(turn_id="t1", round=1, call_id="t1.1.0", tool_id="demo.weather", params={"city": "Paris"},
               trait="exploration"),
    RoundCompleted(turn_id="t1", round=1,
                   streamed_state=StreamedState(answer_streamed=False, answer_text="",
                                                lanes=[Lane(index=0, lane="tool", status="allowed", emitted_chars=0)]),
                   accepted=[AcceptedAction(index=0, action="call_tool", tool_id="demo.weather")], denied=[],
                   notices=[]),
    ToolResult(turn_id="t1", call_id="t1.1.0", tool_id="demo.weather", ok=True, duration_ms=3,
               result={"temp_c": 12}),
    AnswerDelta(turn_id="t1", round=2, text="It is "),
    AnswerDelta(turn_id="t1", round=2, text="raining."),
    completed(final_answer="It is raining."),
]
DEMO_TURN = [event(seq, data) for seq, data in enumerate(DEMO_DATA, 1)]


def events_of(step: Step) -> list[Event]:
    return [item for item in step.shown if isinstance(item, Event)]


# -- opening, subscribing, sending ---------------------------------------------------------------


def test_a_new_connection_opens_and_subscribes_only_after_the_open_ack() -> None:
    chat = new_chat()
    assert connect(chat) == Open(id="id1")
    sends, step = receive(chat, ack("id1", conversation_id=CID, last_seq=0))
    assert chat.session.conversation_id == CID and chat.session.ready
    assert sends == [Subscribe(id="id2", conversation_id=CID, after_seq=0)]
    assert Info(f"conversation {CID}") in step.shown
    assert render_all(step.shown) == f"conversation {CID}\n"


def test_reopening_a_named_conversation_replays_it_from_the_start() -> None:
    chat = new_chat(CID)
    assert connect(chat) == Open(id="id1", conversation_id=CID)
    sends, _ = receive(chat, ack("id1", conversation_id=CID, last_seq=40))
    assert sends == [Subscribe(id="id2", conversation_id=CID, after_seq=0)]


def test_agent_and_mode_are_sent_only_with_the_first_open() -> None:
    chat = new_chat(agent="demo", mode="ask")
    assert connect(chat) == Open(id="id1", agent="demo", mode=Mode.ASK)
    receive(chat, ack("id1", conversation_id=CID, last_seq=0))
    chat.session.disconnected()
    # The mode is sticky on the server and may have changed since: a re-open never resets it.
    assert connect(chat) == Open(id="id3", conversation_id=CID)


def test_a_message_typed_before_the_open_ack_is_sent_right_after_it() -> None:
    chat = new_chat()
    connect(chat)
    assert typed(chat, "hello\n")[0] == []
    sends, _ = receive(chat, ack("id1", conversation_id=CID, last_seq=0))
    assert sends == [
        Subscribe(id="id3", conversation_id=CID, after_seq=0),
        UserMessageFrame(id="id2", conversation_id=CID, text="hello"),
    ]


def test_every_command_gets_a_unique_id() -> None:
    chat, _ = ready_chat()
    frames = [typed(chat, text)[0][0] for text in ("a", "b", "/steer c", "/mode ask", "/cancel")]
    assert len({f.id for f in frames}) == len(frames)


def test_default_ids_are_uuid_hex() -> None:
    chat = Chat(ClientSession())
    frame = connect(chat)
    assert len(frame.id) == 32 and int(frame.id, 16) >= 0


# -- seq tracking: no gap, no duplicate ---------------------------------------------------------


def test_events_render_in_seq_order_and_repeats_are_dropped() -> None:
    chat, _ = ready_chat()
    _, first = receive(chat, *DEMO_TURN[:5])
    _, replay = receive(chat, *DEMO_TURN[:5])  # a restarted subscription replays what we saw
    assert [e.seq for e in events_of(first)] == [1, 2, 3, 4, 5] and replay.shown == []
    assert chat.session.duplicates_dropped == 5
    assert chat.session.last_seq == 5


def test_a_gap_is_never_rendered_and_resubscribes_once_from_the_last_seen_seq() -> None:
    chat, _ = ready_chat()
    receive(chat, DEMO_TURN[0])
    receive(chat, ack("id2"))  # the first subscription is acked
    sends, step = receive(chat, DEMO_TURN[2], DEMO_TURN[3])  # seq 2 went missing
    assert step.shown == [Status("gap after seq 1 (got 3): re-subscribing")]
    assert sends == [Subscribe(id="id3", conversation_id=CID, after_seq=1)]
    assert chat.session.last_seq == 1
    _, step = receive(chat, ack("id3"), *DEMO_TURN[1:5])
    assert [type(e.data) for e in events_of(step)] == [ThinkingDelta, ThinkingDelta, ToolCalled, RoundCompleted]
    assert chat.session.last_seq == 5


def test_events_of_another_conversation_are_ignored() -> None:
    chat, _ = ready_chat()
    other = encode_event(Event.of("c_other", 1, DEMO_DATA[0], 0.0))
    assert receive(chat, other)[1].shown == []
    assert chat.session.last_seq == 0


def test_slow_consumer_resubscribes_after_the_last_rendered_seq() -> None:
    chat, _ = ready_chat()
    receive(chat, *DEMO_TURN[:3])
    sends, step = receive(chat, error(ErrorCode.SLOW_CONSUMER, "paused", conversation_id=CID, last_seq=2))
    assert sends == [Subscribe(id="id3", conversation_id=CID, after_seq=3)]
    assert step.shown == [Status("slow consumer: resuming after seq 3")]


# -- reconnect and resume ------------------------------------------------------------------------


def test_reconnect_reopens_the_same_conversation_and_subscribes_after_the_last_seq() -> None:
    chat, _ = ready_chat()
    receive(chat, *DEMO_TURN[:6])
    chat.session.disconnected()
    assert not chat.session.ready
    assert connect(chat) == Open(id="id3", conversation_id=CID)
    sends, step = receive(chat, ack("id3", conversation_id=CID, last_seq=9))
    assert sends == [Subscribe(id="id4", conversation_id=CID, after_seq=6)]
    assert Status("reconnected: resuming after seq 6") in step.shown
    _, rest = receive(chat, *DEMO_TURN)  # the server replays from 7; anything older is dropped
    assert [type(e.data) for e in events_of(rest)] == [AnswerDelta, AnswerDelta, TurnCompleted]


def test_an_unacked_message_is_resent_with_the_same_id_after_a_reconnect() -> None:
    chat, _ = ready_chat()
    (sent,), _ = typed(chat, "weather?")
    chat.session.disconnected()
    connect(chat)
    sends, _ = receive(chat, ack("id4", conversation_id=CID, last_seq=0))
    assert sent in sends  # same id: the server acks the repeat `duplicate` and does nothing
    receive(chat, ack(sent.id, status="duplicate"))
    chat.session.disconnected()
    connect(chat)
    assert all(not isinstance(f, UserMessageFrame) for f in receive(chat, ack("id6", conversation_id=CID))[0])


def test_an_unacked_cancel_is_not_resent_because_it_is_not_idempotent() -> None:
    chat, _ = ready_chat()
    typed(chat, "/cancel")
    chat.session.disconnected()
    _, step = pump(chat)
    assert step.shown == [Status("cancel may not have reached the server: send it again")]
    connect(chat)
    assert all(not isinstance(f, CancelFrame) for f in receive(chat, ack("id4", conversation_id=CID))[0])


def test_an_error_for_a_command_drops_it_from_the_resend_list() -> None:
    chat, _ = ready_chat()
    receive(chat, ask_event())
    (sent,), _ = typed(chat, "Paris")
    _, step = receive(chat, error(ErrorCode.NOT_FOUND, "no question is waiting", id=sent.id))
    assert step.shown == [Problem("not_found", "no question is waiting")]
    assert chat.session.pending_ids == ()


def test_a_rate_limited_command_stays_pending_and_is_sent_again_with_its_id() -> None:
    chat, _ = ready_chat()
    (sent,), _ = typed(chat, "x")
    _, step = receive(chat, error(ErrorCode.RATE_LIMITED, "slow down", id=sent.id))
    assert step.shown == [Status("user_message not processed (rate_limited): sending it again shortly")]
    assert chat.session.pending_ids == (sent.id,)
    chat.session.retry(sent.id)  # what the connection does after its pause
    assert pump(chat)[0] == [sent]


def test_open_refused_is_fatal() -> None:
    chat = new_chat(CID)
    connect(chat)
    assert receive(chat, error(ErrorCode.FORBIDDEN, "forbidden: no such conversation", id="id1"))[1].fatal


def test_connection_status_goes_to_stderr_not_the_transcript() -> None:
    chat, _ = ready_chat()
    step = chat.on_output(ConnectionLost("connection lost (1012 server draining)", 0.25))
    assert step.shown == [Status("connection lost (1012 server draining); reconnecting in 0.25 s")]
    assert render_all(step.shown) == ""


# -- what events show ----------------------------------------------------------------------------


def test_events_are_shown_as_their_typed_payloads() -> None:
    chat, _ = ready_chat()
    _, step = receive(chat, *DEMO_TURN)
    assert [e.data for e in events_of(step)] == DEMO_DATA


def test_notices_ui_commands_fallbacks_and_traces_are_rendered() -> None:
    chat, _ = ready_chat()
    notice = Notice(code=NoticeCode.FINISH_ILLEGAL, message="observe first", index=0, violations=("no observation",))
    _, step = receive(
        chat,
        event(1, Fallback(from_model="a", to_model="b", error="rate_limit")),
        event(2, round_completed([notice])),
        event(3, UiCommand(turn_id="t1", command="open_tab", args={"name": "x"})),
        event(4, Salvaged(turn_id="t1", round=2, answer_chars=5)),
        event(5, IllegalFinish(turn_id="t1", round=1, events=[])),
    )
    assert len(events_of(step)) == 5
    assert render_all(step.shown) == (
        "⇄ fallback a → b (rate_limit)\n"
        "notice finish.illegal: observe first (no observation)\n"
        '⇢ ui open_tab {"name":"x"}\n'
        "trace salvaged\n"
    )


def test_the_users_words_from_the_log_are_shown_unless_typed_here() -> None:
    """A replayed conversation (another device, --conversation) shows what the user wrote; what this
    prompt sent is on the terminal already and is not drawn twice (docs/wire-protocol.md#usermessage)."""
    chat, _ = ready_chat()
    typed = chat.send_message("and tomorrow?")
    _, step = receive(
        chat,
        event(1, UserSaid(message_id="m-elsewhere", text="weather in Paris?")),
        event(2, UserSaid(message_id="s-1", text="shorter, please", kind=MessageKind.STEER)),
        event(3, UserSaid(message_id=typed, text="and tomorrow?", kind=MessageKind.FOLLOW_UP)),
    )
    shown = Transcript(mine=chat.mine)
    assert "".join(t for item in step.shown for t, _ in shown.segments(item)) == (
        "you › weather in Paris?\nyou › shorter, please (steer)\n")


def test_an_answer_cut_short_is_shown_as_cut_not_as_finished() -> None:
    chat, _ = ready_chat()
    _, step = receive(
        chat,
        event(1, TurnStarted(turn_id="t1", user_message_id="m1")),
        event(2, AnswerDelta(turn_id="t1", round=1, text="It is rain")),
        event(3, TurnCompleted(turn_id="t1", reason=EndReason.SALVAGED, final_answer="It is rain", used_tools=True,
                               finish_ok=True, partial=True)),
    )
    assert render_all(step.shown) == "It is rain\n✂ turn t1 salvaged: the answer was cut short\n"


def test_an_event_of_a_kind_this_version_does_not_know_is_shown_as_plain_data() -> None:
    chat, _ = ready_chat()
    _, step = receive(chat, event(1, {"turn_id": "t1", "level": 3}, name="budget.warning"))
    assert chat.session.last_seq == 1
    assert render_all(step.shown) == 'budget.warning {"turn_id":"t1","level":3}\n'


def test_a_final_answer_that_never_streamed_is_shown_once() -> None:
    chat, _ = ready_chat()
    _, step = receive(
        chat,
        event(1, TurnStarted(turn_id="t1", user_message_id="m")),
        event(2, completed(reason=EndReason.PROTOCOL_VIOLATION, final_answer="Sorry.", used_tools=False,
                           finish_ok=False)),
    )
    assert render_all(step.shown) == "Sorry.\n! turn t1 protocol_violation, no tools used, finish not ok\n"


def test_a_streamed_final_answer_is_not_repeated() -> None:
    chat, _ = ready_chat()
    _, step = receive(chat, *DEMO_TURN)
    assert render_all(step.shown).count("It is raining.") == 1


def test_message_mode_is_done_when_its_own_turn_completes() -> None:
    chat = new_chat()
    chat.send_message("weather?", await_turn=True)  # id1, queued until the open ack
    open_frame = connect(chat)
    receive(chat, ack(open_frame.id, conversation_id=CID, last_seq=0))
    earlier = [
        event(1, TurnStarted(turn_id="t0", user_message_id="someone-else")),
        event(2, completed("t0", final_answer="x")),
    ]
    assert not receive(chat, *earlier)[1].done
    mine = [
        event(3, TurnStarted(turn_id="t1", user_message_id="id1")),
        event(4, completed("t1", final_answer="y")),
    ]
    assert receive(chat, *mine)[1].done


def test_a_provider_error_turn_shows_the_message_and_the_cause() -> None:
    chat, _ = ready_chat()
    cause = "auth: the variable ACME_LLM_KEY (api_key_env) is not set where this model is called"
    _, step = receive(
        chat,
        event(1, TurnStarted(turn_id="t1", user_message_id="m")),
        event(2, TurnCompleted(turn_id="t1", reason=EndReason.PROVIDER_ERROR, final_answer="Sorry — the provider.",
                               used_tools=False, finish_ok=False, error=cause)),
    )
    assert render_all(step.shown) == f"Sorry — the provider.\n! turn t1 provider_error ({cause}), no tools used, finish not ok\n"


@pytest.mark.parametrize(("reason", "partial", "code"), [
    (EndReason.COMPLETE, False, 0),
    (EndReason.EXIT, False, 0),
    (EndReason.SALVAGED, False, 0),
    (EndReason.SALVAGED, True, 1),            # cut short: not an answer
    (EndReason.PROVIDER_ERROR, False, 1),
    (EndReason.PROTOCOL_VIOLATION, False, 1),
    (EndReason.ITERATION_LIMIT, False, 1),
    (EndReason.ERROR, False, 1),
    (EndReason.CANCELLED, False, 1),
])
def test_message_mode_exits_0_only_when_its_turn_gave_an_answer(reason: EndReason, partial: bool, code: int) -> None:
    chat = new_chat()
    chat.send_message("weather?", await_turn=True)
    receive(chat, ack(connect(chat).id, conversation_id=CID, last_seq=0))
    done = TurnCompleted(turn_id="t1", reason=reason, final_answer="x", used_tools=True, finish_ok=False, partial=partial)
    assert receive(chat, event(1, TurnStarted(turn_id="t1", user_message_id="id1")), event(2, done))[1].done
    assert chat.awaited_end == done and turn_exit_code(done) == code


# -- --resume: the last conversation per server URL ----------------------------------------------


def test_the_state_file_is_in_the_users_cache_unless_the_variable_names_one(tmp_path: Path) -> None:
    assert state_path({"REACTGATE_CHAT_STATE": str(tmp_path / "s.json"), "HOME": "/h"}) == tmp_path / "s.json"
    assert state_path({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/reactgate/chat.json")
    assert state_path({"HOME": "/h"}) == Path("/h/.cache/reactgate/chat.json")


def test_the_last_conversation_is_remembered_per_url_and_forgotten_once_deleted(tmp_path: Path) -> None:
    last = LastConversations(tmp_path / "dir" / "chat.json")
    assert last.get("ws://a/ws") is None                     # no file yet
    last.remember("ws://a/ws", "c_1")
    last.remember("ws://b/ws", "c_2")
    last.remember("ws://a/ws", "c_3")
    assert (last.get("ws://a/ws"), last.get("ws://b/ws")) == ("c_3", "c_2")
    last.forget("ws://a/ws", "c_1")                          # not the one remembered: kept
    last.forget("ws://b/ws", "c_2")
    assert (last.get("ws://a/ws"), last.get("ws://b/ws")) == ("c_3", None)
    (tmp_path / "dir" / "chat.json").write_text("{not json")
    assert last.get("ws://a/ws") is None                     # a broken file is no shortcut, not a crash


def test_ctrl_c_says_how_to_come_back() -> None:
    assert come_back("ws://127.0.0.1:8765/ws", "c_X", "ws://127.0.0.1:8765/ws") == (
        "to come back to this conversation: reactgate chat --resume (or reactgate chat --conversation c_X)")
    assert come_back("ws://h:1/ws", "c_X", "ws://127.0.0.1:8765/ws") == (
        "to come back to this conversation: reactgate chat --resume --url ws://h:1/ws "
        "(or reactgate chat --url ws://h:1/ws --conversation c_X)")


# -- ask_user and commands at the prompt ---------------------------------------------------------

ASK = AskUser(turn_id="t1", ask_id="t1.1.0", question="Which city?", options=["Paris", "Oslo"], timeout_s=300)


def ask_event(seq: int = 1) -> bytes:
    return event(seq, ASK)


def test_ask_user_is_rendered_with_its_options() -> None:
    chat, _ = ready_chat()
    _, step = receive(chat, ask_event())
    assert step.shown == [shown(ASK)]
    assert render_all(step.shown) == "? Which city?\n  1. Paris\n  2. Oslo\n  answer with a number or text\n"


@pytest.mark.parametrize(("line", "answer"), [("2", "Oslo"), ("1", "Paris"), ("Bergen", "Bergen"), ("7", "7")])
def test_the_next_line_answers_the_question_and_carries_the_ask_id(line: str, answer: str) -> None:
    chat, _ = ready_chat()
    receive(chat, ask_event())
    (frame,), _ = typed(chat, line)
    assert isinstance(frame, AnswerFrame)
    assert (frame.ask_id, frame.answer, frame.conversation_id) == ("t1.1.0", answer, CID)
    assert isinstance(typed(chat, "next")[0][0], UserMessageFrame)  # the question was answered


def test_a_question_answered_elsewhere_no_longer_takes_the_next_line() -> None:
    chat, _ = ready_chat()
    receive(chat, ask_event(1), event(2, ToolResult(turn_id="t1", call_id="t1.1.0", tool_id="react.ask_user",
                                                     ok=True, duration_ms=0, result={"answer": "Paris"})))
    assert isinstance(typed(chat, "hello")[0][0], UserMessageFrame)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("/mode ask", SetModeFrame(id="id3", conversation_id=CID, mode=Mode.ASK)),
        ("/mode agent", SetModeFrame(id="id3", conversation_id=CID, mode=Mode.AGENT)),
        ("/steer only Paris", SteerFrame(id="id3", conversation_id=CID, text="only Paris")),
        ("/cancel", CancelFrame(id="id3", conversation_id=CID)),
        ("//slash text", UserMessageFrame(id="id3", conversation_id=CID, text="/slash text")),
        ("plain text", UserMessageFrame(id="id3", conversation_id=CID, text="plain text")),
    ],
)
def test_prompt_lines_become_frames(line: str, expected: ClientFrame) -> None:
    chat, _ = ready_chat()
    assert typed(chat, line)[0] == [expected]


@pytest.mark.parametrize("line", ["/mode", "/mode fast", "/steer", "/export", "/nope"])
def test_bad_commands_are_local_errors(line: str) -> None:
    chat, _ = ready_chat()
    sends, step = typed(chat, line)
    assert sends == [] and isinstance(step.shown[0], Problem) and step.shown[0].code == "usage"


def test_quit_and_blank_lines() -> None:
    chat, _ = ready_chat()
    assert chat.user_input("/quit").quit
    assert chat.user_input("   \n") == Step()
    assert pump(chat) == ([], Step())


def test_an_acked_mode_change_is_confirmed() -> None:
    chat, _ = ready_chat()
    (frame,), _ = typed(chat, "/mode ask")
    assert receive(chat, ack(frame.id))[1].shown == [Info("mode ask (accepted)")]


# -- /delete and /export -------------------------------------------------------------------------


@pytest.mark.parametrize("answer", ["no", "", "y", "/quit", "YES"])
def test_delete_asks_once_and_anything_but_yes_keeps_the_conversation(answer: str) -> None:
    chat, _ = ready_chat()
    assert typed(chat, "/delete") == ([], Step([Info(CONFIRM_DELETE)], idle=True))
    sends, step = typed(chat, answer)
    assert sends == [] and step.shown == [Info("not deleted")] and not step.quit
    assert typed(chat, "hello")[0] == [UserMessageFrame(id="id3", conversation_id=CID, text="hello")]


def test_delete_confirmed_sends_the_delete_and_the_chat_ends_when_it_is_gone() -> None:
    chat, _ = ready_chat()
    typed(chat, "/delete")
    sends, _ = typed(chat, "yes")
    assert sends == [DeleteFrame(id="id3", conversation_id=CID)]
    _, step = receive(chat, ack("id3", conversation_id=CID))
    assert step.shown == [Info(f"conversation {CID} deleted")]
    assert chat.session.ended == "deleted"


def test_export_writes_every_event_as_the_frame_it_came_in_then_says_how_many(tmp_path: Path) -> None:
    chat, _ = ready_chat()
    receive(chat, *DEMO_TURN)
    path = tmp_path / "out.jsonl"
    sends, step = typed(chat, f"/export {path}")
    assert sends == [ExportFrame(id="id3", conversation_id=CID)] and step == Step()
    last = len(DEMO_TURN)
    done = encode_frame(ExportCompleted(id="id3", conversation_id=CID, events=last, last_seq=last))
    _, step = receive(chat, ack("id3", conversation_id=CID, last_seq=last), *DEMO_TURN, done)
    assert step.save == Save(str(path), [frame.decode() for frame in DEMO_TURN], last) and step.idle
    assert write_export(step.save) == Info(f"exported {last} events to {path}")
    assert path.read_bytes() == b"".join(frame + b"\n" for frame in DEMO_TURN)


def test_an_export_that_cannot_be_written_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    shown = write_export(Save(str(tmp_path / "no" / "such" / "dir.jsonl"), ["{}"], 1))
    assert isinstance(shown, Problem) and shown.code == "export"


# -- the transcript ------------------------------------------------------------------------------


def test_transcript_streams_inline_and_breaks_lines_between_lanes() -> None:
    chat, _ = ready_chat()
    text = render_all(receive(chat, *DEMO_TURN)[1].shown)
    assert text == (
        "thinking: Checking Paris.\n"
        '→ demo.weather {"city":"Paris"} [exploration]\n'
        '← demo.weather ok 3 ms {"temp_c":12}\n'
        "It is raining.\n"
        "✓ turn t1 complete\n"
    )


def test_a_resumed_answer_continues_on_the_same_line() -> None:
    transcript = Transcript()
    parts = [transcript.segments(shown(AnswerDelta(turn_id="t1", round=2, text="It is "), 1)),
             transcript.segments(Status("reconnected")),
             transcript.segments(shown(AnswerDelta(turn_id="t1", round=2, text="raining."), 2))]
    assert "".join(t for seg in parts for t, _ in seg) == "It is raining."


def test_tool_errors_and_notices_are_one_line_each() -> None:
    notice = Notice(code=NoticeCode.ASK_MODE_DENIED, message="write tools are off in ask mode",
                    tool_id="demo.write_note")
    text = render_all([
        shown(ToolResult(turn_id="t2", call_id="c", tool_id="demo.fail", ok=False, duration_ms=1,
                         error="tool_error", detail={"message": "boom"}), 1),
        shown(round_completed([notice], turn_id="t2"), 2),
        shown(completed("t2", EndReason.CANCELLED, finish_ok=False), 3),
    ])
    assert text == (
        '← demo.fail error 1 ms {"error":"tool_error","message":"boom"}\n'
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
    # --resume's state file: never the user's own (a test that reads it passes its own).
    state = Path(tempfile.gettempdir()) / f"reactgate-chat-test-{os.getpid()}.json"
    return env | {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "TERM": "dumb",
                  "REACTGATE_CHAT_STATE": str(state)}


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

    async def wait_for_output(self, text: str, timeout: float = 60, stream: str = "stdout") -> None:
        """Until `text` is in the chat's stdout (the transcript) or, with stream="stderr", its status lines."""
        async def wait() -> None:
            exited = asyncio.ensure_future(self.proc.wait())  # wakes the wait too: an exit is no output
            try:
                while text not in getattr(self, stream):
                    if exited.done():
                        pytest.fail(f"chat exited {self.proc.returncode} before {text!r}:\n{self.stdout}\n{self.stderr}")
                    self.changed.clear()
                    changed = asyncio.ensure_future(self.changed.wait())
                    await asyncio.wait({changed, exited}, return_when=asyncio.FIRST_COMPLETED)
                    changed.cancel()
            finally:
                exited.cancel()

        await asyncio.wait_for(wait(), timeout)

    async def type(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\n".encode())
        await self.proc.stdin.drain()


@contextlib.asynccontextmanager
async def chat(*args: str, env: dict[str, str] | None = None, stdin: bool = False) -> AsyncIterator[ChatRun]:
    """`reactgate chat ARGS` as a subprocess; `stdin`: lines can be typed (`ChatRun.type`)."""
    proc = await asyncio.create_subprocess_exec(
        *chat_command(), "chat", *args, cwd=REPO, env=chat_env() | (env or {}),
        stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
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
async def test_chat_reopening_a_conversation_shows_what_the_user_wrote(tmp_path: Path) -> None:
    """Another client (a second device) reopening the conversation replays both sides of it."""
    async with gateway(local_backend(tmp_path)) as (_, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "weather in Paris?", "--url", url) as first:
            assert await first.exit_code(120) == 0, first.stderr
        cid = first.stdout.split()[1]
        async with chat("--conversation", cid, "--message", "and tomorrow?", "--url", url) as second:
            assert await second.exit_code(120) == 0, second.stderr
    out = second.stdout
    assert "you › weather in Paris?" in out and out.index("you › weather in Paris?") < out.index(DEMO_ANSWER)
    assert "you › and tomorrow?" not in out   # sent by this client: not drawn again
    assert "weather in Paris?" not in first.stdout.replace("thinking: Checking the weather in Paris.", "")


@pytest.mark.slow
async def test_chat_resumes_across_a_gateway_drain_and_prints_the_answer_exactly_once(tmp_path: Path) -> None:
    backend = SharedBackend(local_backend(tmp_path))
    try:
        async with gateway(backend) as (first, port):
            url = f"ws://127.0.0.1:{port}/ws"
            async with chat("--message", "weather in Paris?", "--url", url) as run:
                await run.wait_for_output("It is", timeout=120)  # the answer is streaming
                await first.drain()                              # clients get 1012, the turn goes on
                await run.wait_for_output("cannot connect", stream="stderr")  # a reconnect to no gateway failed
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
    and port re-activates it (docs/design.md#recovery: an answer that had started streaming is
    continued, else the round is decided again) and the client, re-subscribed after its last seq,
    prints the rest of the turn once: the whole answer, each character once."""
    async with gateway(local_backend(tmp_path)) as (first, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "weather in Paris?", "--url", url) as run:
            await run.wait_for_output(cut_at, timeout=120)
            await first.drain()
            async with gateway(local_backend(tmp_path), port):
                assert await run.exit_code() == 0, run.stderr
    assert "1012" in run.stderr and "reconnected: resuming after seq" in run.stderr
    answers = [line for line in run.stdout.splitlines() if line.startswith("It is")]
    assert answers == [DEMO_ANSWER], run.stdout
    assert "✓ turn t1 complete" in run.stdout, run.stdout


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
    now = int(time.time())
    token = jwt.encode({"sub": "alice", "tenant": "acme", "iat": now, "exp": now + 600}, secret, algorithm="HS256")
    async with gateway(local_backend(tmp_path), auth_secret=secret) as (_, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "hi", "--url", url) as refused:
            assert await refused.exit_code() == 2
        assert "HTTP 401" in refused.stderr
        async with chat("--message", "weather in Paris?", "--url", url, env={"REACTGATE_TOKEN": token}) as run:
            assert await run.exit_code(120) == 0, run.stderr
    assert run.stdout.count(DEMO_ANSWER) == 1


@pytest.mark.slow
async def test_chat_exports_the_conversation_to_a_file_then_deletes_it(tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    async with gateway(local_backend(tmp_path)) as (_, port), chat(
        "--url", f"ws://127.0.0.1:{port}/ws", stdin=True
    ) as run:
        await run.wait_for_output("conversation c_")
        await run.type("weather in Paris?")
        await run.wait_for_output("✓ turn t1")
        await run.type(f"/export {out}")
        await run.wait_for_output(f"events to {out}")
        await run.type("/delete")
        await run.wait_for_output(CONFIRM_DELETE)
        await run.type("yes")
        assert await run.exit_code() == 0, run.stderr
    cid = run.stdout.split("conversation ", 1)[1].split()[0]
    frames = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1)) and frames[-1]["event"] == "turn.completed"
    assert {f["conversation_id"] for f in frames} == {cid}
    assert f"exported {len(frames)} events to {out}" in run.stdout
    assert f"conversation {cid} deleted" in run.stdout
    with sqlite3.connect(tmp_path / "chat.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM events WHERE conversation_id = ?", (cid,)).fetchone() == (0,)
        assert db.execute("SELECT count(*) FROM tombstones WHERE conversation_id = ?", (cid,)).fetchone() == (1,)


FAILING_AGENT = """
name = "acme"
model = "openai/acme-small"
[model_settings]
api_base = "http://127.0.0.1:9/v1"
api_key_env = "REACTGATE_TEST_CHAT_UNSET_KEY"
[policies]
max_protocol_retries = 1
"""


@pytest.mark.slow
async def test_chat_message_exits_1_naming_the_cause_when_the_provider_fails(tmp_path: Path) -> None:
    profile = tmp_path / "acme.toml"
    profile.write_text(FAILING_AGENT)
    backend = build_backend(Settings(backend="local", port=0, store=f"sqlite:///{tmp_path}/chat.sqlite3", agent=profile))
    async with gateway(backend) as (_, port), chat("--message", "hi", "--url", f"ws://127.0.0.1:{port}/ws") as run:
        assert await run.exit_code(120) == 1, run.stderr
    cause = "auth: the variable REACTGATE_TEST_CHAT_UNSET_KEY (api_key_env) is not set where this model is called"
    assert ("notice provider_error: the model provider failed (auth) for model 'openai/acme-small': the variable "
            "REACTGATE_TEST_CHAT_UNSET_KEY (api_key_env) is not set where this model is called. This is not your "
            "mistake.") in run.stdout
    assert "Sorry — the model provider failed, so I have no answer this time. Please try again later." in run.stdout
    assert f"! turn t1 provider_error ({cause}), no tools used, finish not ok" in run.stdout


@pytest.mark.slow
async def test_chat_resume_continues_the_last_conversation_on_that_url(tmp_path: Path) -> None:
    state = {"REACTGATE_CHAT_STATE": str(tmp_path / "state" / "chat.json")}
    async with gateway(local_backend(tmp_path)) as (_, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "weather in Paris?", "--url", url, env=state) as first:
            assert await first.exit_code(120) == 0, first.stderr
        cid = first.stdout.split("conversation ", 1)[1].split()[0]
        async with chat("--resume", "--message", "and in Oslo?", "--url", url, env=state) as again:
            assert await again.exit_code(120) == 0, again.stderr
        async with chat("--resume", "--message", "hi", "--url", f"ws://localhost:{port}/ws", env=state) as elsewhere:
            assert await elsewhere.exit_code() == 2
    assert again.stdout.startswith(f"conversation {cid}")
    assert "✓ turn t1 complete" in again.stdout and "✓ turn t2 complete" in again.stdout  # replayed, then the new turn
    assert f"no conversation to resume on ws://localhost:{port}/ws" in elsewhere.stderr


@pytest.mark.slow
async def test_ctrl_c_prints_how_to_come_back(tmp_path: Path) -> None:
    async with gateway(local_backend(tmp_path)) as (_, port), chat(
        "--url", f"ws://127.0.0.1:{port}/ws", stdin=True
    ) as run:
        await run.wait_for_output("conversation c_")
        run.proc.send_signal(signal.SIGINT)
        assert await run.exit_code() == 130, run.stderr
    cid = run.stdout.split("conversation ", 1)[1].split()[0]
    assert (f"to come back to this conversation: reactgate chat --resume --url ws://127.0.0.1:{port}/ws "
            f"(or reactgate chat --url ws://127.0.0.1:{port}/ws --conversation {cid})") in run.stderr


@pytest.mark.slow
async def test_a_chat_killed_mid_answer_and_started_again_with_resume_shows_the_whole_answer_once(tmp_path: Path) -> None:
    """README.md's tour: kill the chat client mid-answer, start it again (`--resume`): the conversation
    is replayed and the answer goes on, each character once."""
    state = {"REACTGATE_CHAT_STATE": str(tmp_path / "chat.json")}
    async with gateway(local_backend(tmp_path)) as (_, port):
        url = f"ws://127.0.0.1:{port}/ws"
        async with chat("--message", "weather in Paris?", "--url", url, env=state) as killed:
            await killed.wait_for_output("It is", timeout=120)     # the answer is streaming
            killed.proc.kill()
            await killed.exit_code()
        async with chat("--resume", "--url", url, env=state, stdin=True) as again:
            await again.wait_for_output("✓ turn t1 complete", timeout=120)
            await again.type("/quit")
            assert await again.exit_code() == 0, again.stderr
    cid = killed.stdout.split("conversation ", 1)[1].split()[0]
    assert f"\nconversation {cid}\n" in again.stdout                  # after the interactive help line
    assert [line for line in again.stdout.splitlines() if line.startswith("It is")] == [DEMO_ANSWER]
