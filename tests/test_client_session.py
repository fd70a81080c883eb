"""client/session.py: the client side of `reactgate.v1`, one rule per test, on plain frames
(docs/wire-protocol.md#10-delivery-idempotency-resume-multiplexing); then the connection shell and
the README's client example against a real gateway.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from client.connection import Backoff, Connection, ConnectionLost
from client.session import (
    ERROR_REACTIONS,
    RESENT_AFTER_RECONNECT,
    RETRY_PAUSE_S,
    UNAVAILABLE_PAUSE_MAX_S,
    Acked,
    ClientSession,
    CommandFailed,
    CommandLost,
    Deleted,
    ExportDone,
    Exported,
    Fatal,
    GapDetected,
    Head,
    Opened,
    Output,
    Reaction,
    Resubscribing,
    Resumed,
    RetryLater,
    Send,
    ServerError,
    Subscribed,
    Target,
    Unreadable,
    retry_pause,
)
from protocol.events import (
    AnswerDelta,
    ConversationDeleted,
    Event,
    EventData,
    ThinkingDelta,
    TurnCompleted,
    TurnStarted,
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
from tests.e2e import local_server

CID = "c_test"
REPO = Path(__file__).resolve().parents[1]


def ids() -> Callable[[], str]:
    counter = iter(range(1, 10_000))
    return lambda: f"id{next(counter)}"


def event(seq: int, data: EventData, conversation_id: str = CID) -> bytes:
    return encode_event(Event.of(conversation_id, seq, data, 0.0))


def thinking(seq: int, text: str = "x", conversation_id: str = CID) -> bytes:
    return event(seq, ThinkingDelta(turn_id="t1", round=1, text=text), conversation_id)


def ack(frame_id: str, **fields: Any) -> bytes:
    return encode_frame(Ack(id=frame_id, status=fields.pop("status", "accepted"), **fields))


def error(code: ErrorCode, message: str = "no", **fields: Any) -> bytes:
    return encode_frame(ErrorFrame(code=code, message=message, **fields))


def sent(outputs: list[Output]) -> list[ClientFrame]:
    return [out.frame for out in outputs if isinstance(out, Send)]


def delivered(outputs: list[Output]) -> list[int]:
    return [out.seq for out in outputs if isinstance(out, Event)]


def feed(session: ClientSession, *frames: bytes) -> list[Output]:
    for frame in frames:
        session.receive(frame)
    return session.outputs()


def opened(conversation_id: str | None = None, **kwargs: Any) -> ClientSession:
    """A session whose first connection is open and subscribed; its outputs drained."""
    session = ClientSession(conversation_id, new_id=ids(), **kwargs)
    session.connected()
    (open_frame,) = sent(session.outputs())
    (subscribe,) = sent(feed(session, ack(open_frame.id, conversation_id=CID, last_seq=0)))
    feed(session, ack(subscribe.id, conversation_id=CID, last_seq=0, after_seq=0))
    return session


def reconnect(session: ClientSession, head: int = 0) -> list[Output]:
    """Drop the connection, connect again, ack the re-open: what the session did."""
    session.disconnected()
    session.connected()
    (open_frame,) = sent(session.outputs())
    return feed(session, ack(open_frame.id, conversation_id=CID, last_seq=head))


# -- the policies, cell by cell ------------------------------------------------------------------


def test_the_error_reaction_table() -> None:
    F, S, R, D, P = Reaction.FATAL, Reaction.RESUBSCRIBE, Reaction.RETRY, Reaction.DROP, Reaction.REPORT
    columns = (Target.OPEN, Target.HEAD, Target.SUBSCRIBE, Target.COMMAND, Target.STREAM)
    expected = {
        ErrorCode.BAD_REQUEST: (F, F, F, D, P),
        ErrorCode.UNAUTHORIZED: (F, F, F, D, F),
        ErrorCode.FORBIDDEN: (F, F, F, D, F),
        ErrorCode.NOT_FOUND: (F, F, F, D, P),
        ErrorCode.RATE_LIMITED: (R, R, R, R, P),
        ErrorCode.TOO_LARGE: (F, F, F, D, P),
        ErrorCode.SLOW_CONSUMER: (S, S, S, S, S),
        ErrorCode.OVERLOADED: (F, F, F, D, P),
        ErrorCode.INTERNAL: (F, F, R, D, S),
        ErrorCode.QUOTA_EXCEEDED: (F, F, F, D, P),
        ErrorCode.UNAVAILABLE: (R, R, R, R, S),
    }
    assert dict(ERROR_REACTIONS) == {
        (code, target): cell for code, row in expected.items() for target, cell in zip(columns, row, strict=True)
    }
    assert {code for code, _ in ERROR_REACTIONS} == set(ErrorCode)  # total


def test_the_resend_table() -> None:
    assert dict(RESENT_AFTER_RECONNECT) == {
        UserMessageFrame: True, SteerFrame: True, AnswerFrame: True, SetModeFrame: True, CancelFrame: False,
        DeleteFrame: True, ExportFrame: True,
    }


# -- ids ------------------------------------------------------------------------------------------


def test_frame_ids_come_from_the_injected_factory_and_never_repeat() -> None:
    session = opened()
    for issue in (lambda: session.user_message("a"), lambda: session.steer("b"), lambda: session.set_mode("ask"),
                  lambda: session.answer("t1.1.0", "yes"), session.cancel):
        issue()
    frames = sent(session.outputs())
    assert [f.id for f in frames] == ["id3", "id4", "id5", "id6", "id7"]


def test_default_ids_are_uuid_hex() -> None:
    session = ClientSession()
    session.connected()
    (frame,) = sent(session.outputs())
    assert re.fullmatch(r"[0-9a-f]{32}", frame.id)


# -- opening and resuming ------------------------------------------------------------------------


def test_the_first_open_creates_the_conversation_with_agent_and_mode() -> None:
    session = ClientSession(new_id=ids(), agent="demo", mode=Mode.ASK)
    session.connected()
    assert session.outputs() == [Send(Open(id="id1", agent="demo", mode=Mode.ASK))]
    outputs = feed(session, ack("id1", conversation_id=CID, last_seq=0))
    assert outputs == [Opened(CID, 0), Send(Subscribe(id="id2", conversation_id=CID, after_seq=0))]
    assert session.conversation_id == CID and session.ready


def test_a_named_conversation_is_reopened_without_agent_and_replayed_from_the_start() -> None:
    session = ClientSession(CID, new_id=ids(), agent="demo", mode=Mode.AGENT)
    session.connected()
    assert sent(session.outputs()) == [Open(id="id1", conversation_id=CID, mode=Mode.AGENT)]
    outputs = feed(session, ack("id1", conversation_id=CID, last_seq=40))
    assert outputs == [Opened(CID, 40), Send(Subscribe(id="id2", conversation_id=CID, after_seq=0))]


def test_mode_is_not_reapplied_on_reconnect() -> None:
    session = opened(mode=Mode.ASK, agent="demo")
    session.disconnected()
    session.connected()
    # The mode is sticky on the server and may have changed since: a re-open never resets it.
    assert sent(session.outputs()) == [Open(id="id3", conversation_id=CID)]


def test_nothing_but_the_open_is_sent_before_its_ack() -> None:
    session = ClientSession(new_id=ids())
    session.connected()
    session.outputs()
    message_id = session.user_message("hello")
    assert session.outputs() == []
    assert sent(feed(session, ack("id1", conversation_id=CID, last_seq=0))) == [
        Subscribe(id="id3", conversation_id=CID, after_seq=0),
        UserMessageFrame(id=message_id, conversation_id=CID, text="hello"),
    ]


def test_a_reconnect_resumes_after_the_last_delivered_seq_and_says_so() -> None:
    session = opened()
    feed(session, *(thinking(seq) for seq in range(1, 7)))
    outputs = reconnect(session, head=9)
    assert outputs == [Resumed(after_seq=6, head=9), Send(Subscribe(id="id4", conversation_id=CID, after_seq=6))]
    assert delivered(feed(session, *(thinking(seq) for seq in range(1, 10)))) == [7, 8, 9]


def test_the_subscribe_ack_says_where_the_replay_ends() -> None:
    session = opened()
    feed(session, thinking(1))
    (subscribe,) = sent(reconnect(session, head=5))
    assert feed(session, ack(subscribe.id, conversation_id=CID, last_seq=5, after_seq=1)) == [Subscribed(1, 5)]


def test_an_open_ack_for_another_conversation_is_fatal() -> None:
    session = ClientSession(CID, new_id=ids())
    session.connected()
    session.outputs()
    outputs = feed(session, ack("id1", conversation_id="c_other", last_seq=0))
    assert outputs == [Fatal(f"asked to re-open {CID}, the server opened c_other")]


# -- commands: resend with the same id ---------------------------------------------------------


@pytest.mark.parametrize("issue", [
    lambda s: s.user_message("weather?"),
    lambda s: s.steer("only Paris"),
    lambda s: s.answer("t1.1.0", "Paris"),
    lambda s: s.set_mode(Mode.ASK),
], ids=["user_message", "steer", "answer", "set_mode"])
def test_an_unacked_command_is_resent_with_the_same_id_after_a_reconnect(
    issue: Callable[[ClientSession], str],
) -> None:
    session = opened()
    issue(session)
    (first,) = sent(session.outputs())
    outputs = reconnect(session)
    assert Send(first, resend=True) in outputs  # same id: the server acks the repeat `duplicate`
    assert feed(session, ack(first.id, status="duplicate", conversation_id=CID)) == [
        Acked(first, "duplicate", resent=True)  # type: ignore[arg-type]
    ]


def test_an_acked_command_is_not_resent() -> None:
    session = opened()
    session.user_message("weather?")
    (message,) = sent(session.outputs())
    assert feed(session, ack(message.id, conversation_id=CID)) == [Acked(message, "accepted", resent=False)]  # type: ignore[arg-type]
    assert sent(reconnect(session)) == [Subscribe(id="id5", conversation_id=CID, after_seq=0)]


def test_a_cancel_is_not_resent_and_the_shell_is_told_it_may_not_have_arrived() -> None:
    session = opened()
    session.cancel()
    (cancel,) = sent(session.outputs())
    session.disconnected()
    assert session.outputs() == [CommandLost(cancel)]  # type: ignore[arg-type]
    session.connected()
    (open_frame,) = sent(session.outputs())
    assert not any(isinstance(f, CancelFrame) for f in sent(feed(session, ack(open_frame.id, conversation_id=CID))))
    assert session.pending_ids == ()


def test_a_cancel_issued_while_disconnected_is_sent_with_the_next_open_ack() -> None:
    session = opened()
    session.disconnected()
    cancel_id = session.cancel()
    assert session.outputs() == []
    session.connected()
    (open_frame,) = sent(session.outputs())
    frames = sent(feed(session, ack(open_frame.id, conversation_id=CID)))
    assert CancelFrame(id=cancel_id, conversation_id=CID) in frames


def test_pending_commands_are_resent_in_the_order_they_were_issued() -> None:
    session = opened()
    first, second, third = session.user_message("a"), session.set_mode("ask"), session.steer("b")
    session.outputs()
    assert [f.id for f in sent(reconnect(session))][1:] == [first, second, third]


# -- events: in order, exactly once --------------------------------------------------------------


def test_events_are_delivered_in_seq_order() -> None:
    session = opened()
    data = [TurnStarted(turn_id="t1", user_message_id="m1"), AnswerDelta(turn_id="t1", round=1, text="Hi"),
            TurnCompleted(turn_id="t1", reason="complete", final_answer="Hi", used_tools=False, finish_ok=True)]  # type: ignore[arg-type]
    outputs = feed(session, *(event(seq, d) for seq, d in enumerate(data, 1)))
    assert [out.data for out in outputs if isinstance(out, Event)] == data
    assert session.last_seq == 3


def test_a_duplicate_seq_is_dropped() -> None:
    session = opened()
    feed(session, thinking(1), thinking(2))
    assert feed(session, thinking(1), thinking(2)) == []  # a restarted subscription replays what we saw
    assert session.duplicates_dropped == 2 and session.last_seq == 2


def test_a_gap_resubscribes_once_from_the_last_delivered_seq() -> None:
    session = opened()
    feed(session, thinking(1))
    outputs = feed(session, thinking(3), thinking(4))  # seq 2 went missing
    assert outputs == [GapDetected(after_seq=1, got=3), Send(Subscribe(id="id3", conversation_id=CID, after_seq=1))]
    assert session.last_seq == 1
    replay = feed(session, ack("id3", conversation_id=CID, last_seq=4, after_seq=1), *(thinking(s) for s in (2, 3, 4)))
    assert delivered(replay) == [2, 3, 4]


def test_a_gap_after_the_resubscribe_was_acked_resubscribes_again() -> None:
    session = opened()
    feed(session, thinking(1), thinking(3), ack("id3", conversation_id=CID, last_seq=3, after_seq=1))
    assert sent(feed(session, thinking(3))) == [Subscribe(id="id4", conversation_id=CID, after_seq=1)]


def test_events_of_another_conversation_are_ignored() -> None:
    session = opened()
    assert feed(session, thinking(1, conversation_id="c_other")) == []
    assert session.last_seq == 0


def test_an_event_whose_data_does_not_fit_its_kind_still_counts_for_the_seq() -> None:
    session = opened()
    raw = b'{"type":"event","conversation_id":"c_test","seq":1,"event":"answer.delta","data":{"text":1},"ts":0.0}'
    (out,) = feed(session, raw)
    assert isinstance(out, Event) and out.data == {"text": 1} and session.last_seq == 1


def test_an_unreadable_frame_is_reported_and_skipped() -> None:
    session = opened()
    (out,) = feed(session, b"not json")
    assert isinstance(out, Unreadable)
    assert delivered(feed(session, thinking(1))) == [1]


# -- errors -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [ErrorCode.FORBIDDEN, ErrorCode.NOT_FOUND, ErrorCode.UNAUTHORIZED])
def test_a_fatal_error_on_open_ends_the_session(code: ErrorCode) -> None:
    session = ClientSession(CID, new_id=ids())
    session.connected()
    session.outputs()
    assert feed(session, error(code, "no such conversation", id="id1")) == [Fatal(f"{code}: no such conversation")]
    assert session.ended == f"{code}: no such conversation"
    session.connected()  # nothing more is sent, nothing more is delivered
    assert session.outputs() == [] and feed(session, thinking(1)) == []


@pytest.mark.parametrize("code", [ErrorCode.FORBIDDEN, ErrorCode.NOT_FOUND, ErrorCode.UNAUTHORIZED])
def test_a_fatal_error_on_subscribe_ends_the_session(code: ErrorCode) -> None:
    session = ClientSession(new_id=ids())
    session.connected()
    session.outputs()
    feed(session, ack("id1", conversation_id=CID, last_seq=0))
    assert feed(session, error(code, "no", id="id2", conversation_id=CID)) == [Fatal(f"{code}: no")]


def test_a_subscription_the_server_ended_as_forbidden_ends_the_session() -> None:
    session = opened()
    outputs = feed(session, error(ErrorCode.FORBIDDEN, "forbidden", conversation_id=CID))
    assert outputs == [Fatal("forbidden: forbidden")]


def test_slow_consumer_resubscribes_after_the_last_delivered_seq() -> None:
    session = opened()
    feed(session, thinking(1), thinking(2), thinking(3))
    # The error's last_seq is what the server handed to the socket; ours is what we delivered.
    outputs = feed(session, error(ErrorCode.SLOW_CONSUMER, "paused", conversation_id=CID, last_seq=2))
    assert outputs == [Resubscribing(3, ErrorCode.SLOW_CONSUMER),
                       Send(Subscribe(id="id3", conversation_id=CID, after_seq=3))]


def test_a_subscription_ended_by_an_internal_error_resubscribes() -> None:
    session = opened()
    feed(session, thinking(1))
    outputs = feed(session, error(ErrorCode.INTERNAL, "subscription ended", conversation_id=CID, last_seq=1))
    assert sent(outputs) == [Subscribe(id="id3", conversation_id=CID, after_seq=1)]


def test_a_rate_limited_command_is_retried_with_the_same_id_when_the_caller_says() -> None:
    session = opened()
    session.user_message("x")
    (message,) = sent(session.outputs())
    assert feed(session, error(ErrorCode.RATE_LIMITED, "slow down", id=message.id)) == [
        RetryLater(message, ErrorCode.RATE_LIMITED)
    ]
    assert session.pending_ids == (message.id,)
    session.retry(message.id)  # the caller's pause is over
    assert session.outputs() == [Send(message)]


# -- unavailable: the store is down; the same frame goes again after retry_after_ms ------------------


def unavailable(frame_id: str | None, retry_after_ms: int | None = 1000, **fields: Any) -> bytes:
    return error(ErrorCode.UNAVAILABLE, "store unavailable: failover; frame not processed", id=frame_id,
                 retry_after_ms=retry_after_ms, **fields)


def test_an_unavailable_command_is_sent_again_with_its_id_after_retry_after_ms_then_acked() -> None:
    session = opened()
    session.user_message("x")
    (message,) = sent(session.outputs())
    assert isinstance(message, UserMessageFrame)
    assert feed(session, unavailable(message.id, 1500)) == [RetryLater(message, ErrorCode.UNAVAILABLE, 1.5)]
    assert session.pending_ids == (message.id,)  # not failed: nothing was done
    assert message not in sent(reconnect(session))  # waits for its pause, even across a reconnect
    session.retry(message.id)  # the shell's 1.5 s are over
    assert sent(session.outputs()) == [message]
    assert feed(session, ack(message.id, conversation_id=CID)) == [Acked(message, "accepted", resent=True)]
    assert session.pending_ids == ()


@pytest.mark.parametrize("kind", ["steer", "delete", "export", "cancel"])
def test_every_pending_frame_waits_out_an_outage(kind: str) -> None:
    session = opened()
    frame_id = {"steer": lambda: session.steer("y"), "delete": session.delete, "export": session.export,
                "cancel": session.cancel}[kind]()
    (frame,) = sent(session.outputs())
    assert frame.id == frame_id
    assert feed(session, unavailable(frame_id, 200)) == [RetryLater(frame, ErrorCode.UNAVAILABLE, 0.2)]
    session.retry(frame_id)
    assert sent(session.outputs()) == [frame]


def test_an_unavailable_open_is_sent_again_with_its_id() -> None:
    session = ClientSession(new_id=ids())
    session.connected()
    (open_frame,) = sent(session.outputs())
    assert feed(session, unavailable(open_frame.id, 3000)) == [RetryLater(open_frame, ErrorCode.UNAVAILABLE, 3.0)]
    assert session.ended is None
    session.retry(open_frame.id)
    assert sent(session.outputs()) == [open_frame]
    outputs = feed(session, ack(open_frame.id, conversation_id=CID, last_seq=0))
    assert outputs[0] == Opened(CID, 0)


def test_an_unavailable_subscribe_is_sent_again_with_its_id() -> None:
    session = ClientSession(new_id=ids())
    session.connected()
    (open_frame,) = sent(session.outputs())
    (subscribe,) = sent(feed(session, ack(open_frame.id, conversation_id=CID, last_seq=0)))
    assert feed(session, unavailable(subscribe.id, 500, conversation_id=CID)) == [
        RetryLater(subscribe, ErrorCode.UNAVAILABLE, 0.5)
    ]
    session.retry(subscribe.id)
    assert sent(session.outputs()) == [subscribe]


def test_without_retry_after_ms_the_pause_doubles_up_to_a_bound_and_starts_over_after_an_ack() -> None:
    session = opened()
    session.user_message("x")
    (message,) = sent(session.outputs())
    pauses = []
    for _ in range(10):
        (later,) = feed(session, unavailable(message.id, None))
        assert isinstance(later, RetryLater)
        pauses.append(later.pause_s)
        session.retry(message.id)
        session.outputs()
    assert pauses == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]
    feed(session, ack(message.id, conversation_id=CID))
    session.steer("y")
    (steer,) = sent(session.outputs())
    assert feed(session, unavailable(steer.id, None)) == [RetryLater(steer, ErrorCode.UNAVAILABLE, RETRY_PAUSE_S)]


def test_a_stream_the_store_could_not_feed_resubscribes_from_the_last_seq() -> None:
    session = opened()
    feed(session, thinking(1), thinking(2))
    outputs = feed(session, unavailable(None, conversation_id=CID, last_seq=2))
    assert outputs[0] == Resubscribing(2, ErrorCode.UNAVAILABLE)
    assert sent(outputs) == [Subscribe(id="id3", conversation_id=CID, after_seq=2)]


def test_the_retry_pause_of_each_code() -> None:
    def frame(code: ErrorCode, retry_after_ms: int | None = None) -> ErrorFrame:
        return ErrorFrame(code=code, message="m", retry_after_ms=retry_after_ms)

    assert retry_pause(frame(ErrorCode.RATE_LIMITED)) == RETRY_PAUSE_S
    assert retry_pause(frame(ErrorCode.INTERNAL), streak=5) == RETRY_PAUSE_S
    assert retry_pause(frame(ErrorCode.UNAVAILABLE, 1200), streak=5) == 1.2  # the server's word first
    assert retry_pause(frame(ErrorCode.UNAVAILABLE, 10**9)) == UNAVAILABLE_PAUSE_MAX_S  # but bounded
    assert retry_pause(frame(ErrorCode.UNAVAILABLE, -5)) == 0.0
    assert retry_pause(frame(ErrorCode.UNAVAILABLE), streak=2) == 2.0
    assert retry_pause(frame(ErrorCode.UNAVAILABLE), streak=10**6) == UNAVAILABLE_PAUSE_MAX_S


def test_a_rate_limited_command_is_not_resent_by_a_reconnect_before_its_retry() -> None:
    session = opened()
    session.user_message("x")
    (message,) = sent(session.outputs())
    feed(session, error(ErrorCode.RATE_LIMITED, "slow down", id=message.id))
    assert message not in sent(reconnect(session))
    session.retry(message.id)
    assert sent(session.outputs()) == [message]


def test_an_internal_error_on_subscribe_is_retried_with_the_same_frame() -> None:
    session = ClientSession(new_id=ids())
    session.connected()
    session.outputs()
    (subscribe,) = sent(feed(session, ack("id1", conversation_id=CID, last_seq=0)))
    assert feed(session, error(ErrorCode.INTERNAL, "internal error (ref 1)", id=subscribe.id)) == [
        RetryLater(subscribe, ErrorCode.INTERNAL)
    ]
    session.retry(subscribe.id)
    assert sent(session.outputs()) == [subscribe]


@pytest.mark.parametrize("code", [ErrorCode.BAD_REQUEST, ErrorCode.NOT_FOUND, ErrorCode.INTERNAL,
                                  ErrorCode.FORBIDDEN, ErrorCode.OVERLOADED])
def test_any_other_error_on_a_command_drops_it_as_never_acted_on(code: ErrorCode) -> None:
    session = opened()
    session.answer("t1.1.0", "Paris")
    (answer,) = sent(session.outputs())
    assert feed(session, error(code, "refused", id=answer.id)) == [CommandFailed(answer, code, "refused")]  # type: ignore[arg-type]
    assert session.pending_ids == ()
    assert answer not in sent(reconnect(session))


def test_an_error_about_no_frame_of_ours_is_reported() -> None:
    session = opened()
    assert feed(session, error(ErrorCode.BAD_REQUEST, "invalid JSON")) == [
        ServerError(ErrorCode.BAD_REQUEST, "invalid JSON")
    ]


def test_an_error_about_a_frame_no_longer_tracked_is_reported_not_acted_on() -> None:
    session = opened()
    feed(session, thinking(1), thinking(3))  # a gap: id3 replaces the subscription id2
    outputs = feed(session, error(ErrorCode.INTERNAL, "internal error (ref 1)", id="id2", conversation_id=CID))
    assert outputs == [ServerError(ErrorCode.INTERNAL, "internal error (ref 1)")]


def test_an_error_about_another_conversation_is_left_to_its_session() -> None:
    session = opened()
    assert feed(session, error(ErrorCode.SLOW_CONSUMER, "paused", conversation_id="c_other", last_seq=3)) == []


# -- the head ----------------------------------------------------------------------------------------


def test_the_head_check_opens_the_conversation_and_answers_with_its_last_seq() -> None:
    session = opened()
    session.check_head()
    (head_open,) = sent(session.outputs())
    assert head_open == Open(id="id3", conversation_id=CID)
    assert feed(session, ack("id3", conversation_id=CID, last_seq=12)) == [Head(12)]


def test_a_head_check_while_disconnected_is_answered_by_the_next_open_ack() -> None:
    session = opened()
    session.disconnected()
    session.check_head()
    assert session.outputs() == []
    assert Head(7) in reconnect(session, head=7)


def test_a_head_check_cut_by_a_drop_is_answered_after_the_reconnect() -> None:
    session = opened()
    session.check_head()
    session.outputs()
    assert Head(4) in reconnect(session, head=4)


def test_a_fatal_error_on_the_head_check_ends_the_session() -> None:
    session = opened()
    session.check_head()
    (head_open,) = sent(session.outputs())
    assert feed(session, error(ErrorCode.FORBIDDEN, "no", id=head_open.id)) == [Fatal("forbidden: no")]


# -- delete and export (docs/wire-protocol.md#delete, docs/wire-protocol.md#export) ------------------


def export_done(frame_id: str, events: int, last_seq: int) -> bytes:
    return encode_frame(ExportCompleted(id=frame_id, conversation_id=CID, events=events, last_seq=last_seq))


def exported(outputs: list[Output]) -> list[int]:
    return [out.event.seq for out in outputs if isinstance(out, Exported)]


def test_an_acked_delete_ends_the_session_with_deleted() -> None:
    session = opened()
    frame_id = session.delete()
    assert sent(session.outputs()) == [DeleteFrame(id=frame_id, conversation_id=CID)]
    outputs = feed(session, ack(frame_id, conversation_id=CID))
    assert outputs == [Acked(DeleteFrame(id=frame_id, conversation_id=CID), "accepted", resent=False), Deleted(CID)]
    assert session.ended == "deleted"
    assert feed(session, thinking(1)) == []
    session.connected()
    assert session.outputs() == []  # nothing to reconnect to


def test_conversation_deleted_is_delivered_then_ends_the_session_whoever_deleted_it() -> None:
    session = opened()
    final = event(3, ConversationDeleted(last_seq=2))
    outputs = feed(session, thinking(1), thinking(2), final)
    assert delivered(outputs) == [1, 2, 3] and outputs[-1] == Deleted(CID)
    assert session.ended == "deleted"


def test_a_delete_whose_ack_was_lost_is_resent_and_a_forbidden_reopen_means_it_went_through() -> None:
    session = opened()
    frame_id = session.delete()
    session.outputs()
    session.disconnected()
    session.connected()
    (reopen,) = sent(session.outputs())
    assert feed(session, error(ErrorCode.FORBIDDEN, "gone", id=reopen.id)) == [Deleted(CID)]  # not Fatal
    session = opened()
    frame_id = session.delete()
    session.outputs()
    assert Send(DeleteFrame(id=frame_id, conversation_id=CID), resend=True) in reconnect(session)


def test_a_delete_refused_fails_like_any_command_and_the_session_goes_on() -> None:
    session = opened()
    frame_id = session.delete()
    session.outputs()
    outputs = feed(session, error(ErrorCode.FORBIDDEN, "not yours", id=frame_id, conversation_id=CID))
    assert outputs == [CommandFailed(DeleteFrame(id=frame_id, conversation_id=CID), ErrorCode.FORBIDDEN, "not yours")]
    assert session.ended is None


def test_an_export_outputs_every_event_once_in_order_then_export_done() -> None:
    session = opened()
    feed(session, thinking(1), thinking(2), thinking(3))
    frame_id = session.export()
    assert sent(session.outputs()) == [ExportFrame(id=frame_id, conversation_id=CID)]
    outputs = feed(session, ack(frame_id, conversation_id=CID, last_seq=3), thinking(1), thinking(2), thinking(3),
                   export_done(frame_id, 3, 3))
    assert exported(outputs) == [1, 2, 3] and delivered(outputs) == []   # already delivered: not again
    assert outputs[-1] == ExportDone(frame_id, 3, 3)
    assert session.duplicates_dropped == 0 and session.pending_ids == ()


def test_an_exports_frames_amid_a_stream_behind_them_are_never_a_gap() -> None:
    session = opened()
    feed(session, thinking(1))
    frame_id = session.export()
    session.outputs()
    # the export's copies (x) and the subscription's own (s), interleaved as one socket carries them
    x1, s2, x2, x3, s3, x4, s4, s5 = (thinking(n) for n in (1, 2, 2, 3, 3, 4, 4, 5))
    outputs = feed(session, ack(frame_id, conversation_id=CID, last_seq=4), x1, s2, x2, x3, s3, x4, s4, s5,
                   export_done(frame_id, 4, 4))
    assert exported(outputs) == [1, 2, 3, 4] and delivered(outputs) == [2, 3, 4, 5]
    assert not any(isinstance(out, GapDetected | Send) for out in outputs)
    assert outputs[-1] == ExportDone(frame_id, 4, 4)


def test_an_export_cut_by_a_reconnect_is_resent_with_its_id_and_goes_on_where_it_stopped() -> None:
    session = opened()
    frame_id = session.export()
    session.outputs()
    assert exported(feed(session, ack(frame_id, conversation_id=CID, last_seq=3), thinking(1))) == [1]
    assert Send(ExportFrame(id=frame_id, conversation_id=CID), resend=True) in reconnect(session)
    outputs = feed(session, ack(frame_id, status="duplicate", conversation_id=CID, last_seq=3),
                   thinking(1), thinking(2), thinking(3), export_done(frame_id, 3, 3))
    assert exported(outputs) == [2, 3] and outputs[-1] == ExportDone(frame_id, 3, 3)


def test_an_export_refused_is_dropped_and_never_completes() -> None:
    session = opened()
    frame_id = session.export()
    session.outputs()
    outputs = feed(session, error(ErrorCode.FORBIDDEN, "no", id=frame_id, conversation_id=CID), thinking(1))
    assert outputs[0] == CommandFailed(ExportFrame(id=frame_id, conversation_id=CID), ErrorCode.FORBIDDEN, "no")
    assert exported(outputs) == [] and delivered(outputs) == [1]


# -- the connection shell and the README example, against a real gateway --------------------------


async def test_the_connection_gives_up_with_fatal_after_the_time_without_a_connection() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    items: list[Any] = []
    connection = Connection(ClientSession(), f"ws://127.0.0.1:{port}/ws", give_up_after_s=0.3,
                            backoff=Backoff(base_s=0.05, cap_s=0.1))
    async with connection:
        async def read() -> None:
            async for item in connection:
                items.append(item)

        await asyncio.wait_for(read(), 20)
    assert isinstance(items[-1], Fatal) and "no connection for 0 s" in items[-1].reason
    assert any(isinstance(item, ConnectionLost) and "cannot connect" in item.reason for item in items)


async def test_the_connection_refused_by_http_404_ends_at_once_with_fatal(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3") as server:
        url = server.url.replace("/ws", "/nope")
        async with Connection(ClientSession(), url) as connection:
            items = [item async for item in connection]
    assert len(items) == 1 and isinstance(items[0], Fatal) and "HTTP 404" in items[0].reason


def readme_example() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Client library", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "the README's Client library section has a python example"
    return found.group(1)


@pytest.mark.slow
async def test_the_readme_client_example_streams_the_answer_from_a_real_gateway(tmp_path: Path) -> None:
    code = readme_example()
    assert "ws://127.0.0.1:8765/ws" in code
    async with local_server(tmp_path / "readme.sqlite3") as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code.replace("ws://127.0.0.1:8765/ws", server.url), cwd=REPO,
            env={k: v for k, v in os.environ.items() if k != "REACTGATE_TOKEN"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert "It rains in Paris, 12 °C." in out.decode()
