"""gateway/dispatch.py without a socket: every client frame type reaches its backend call and gets its
reply (docs/wire-protocol.md#3-client-frames), and every exception a backend call raises becomes its
error frame, or none (docs/wire-protocol.md#5-error-codes).

The backend is tests/fake_backend.py noting each call; the connection is a peer noting, in order,
what it was told to send, watch and export.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from actors.hosting.backend import (
    AckStatus,
    AgentNotServed,
    Answer,
    Cancel,
    Command,
    ConfigurationReplaced,
    Export,
    Forbidden,
    Opened,
    Owner,
    SetMode,
    Steer,
    UnknownAgent,
    UnknownAsk,
    UserMessage,
)
from actors.identity import Caller
from actors.quotas import Quota, QuotaExceeded, Scope
from actors.store.base import StoreUnavailable
from gateway.dispatch import REFUSALS, dispatch, safe_cause
from gateway.frontends import STATUS, retry_after
from protocol.events import Event
from protocol.frames import (
    CLIENT_FRAME_TYPES,
    Ack,
    AnswerFrame,
    CancelFrame,
    ClientFrame,
    ConversationEntry,
    ConversationPage,
    ConversationsFrame,
    DeleteFrame,
    ErrorCode,
    ErrorFrame,
    ExportFrame,
    InvalidCursor,
    ListFrame,
    Mode,
    Open,
    Ping,
    Pong,
    ServerFrame,
    SetModeFrame,
    SteerFrame,
    Subscribe,
    Unsubscribe,
    UserMessageFrame,
)
from tests.fake_backend import FakeBackend, FakeConversation

ALICE = Owner(tenant="acme", sub="alice")
BOB = Owner(tenant="acme", sub="bob")
CID = "c_alice"
HEAD = 3  # events CID holds


class Recorder(FakeBackend):
    """The fake backend, noting every call the gateway makes; `fail` makes the next ones raise it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.fail: BaseException | None = None

    def _call(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    async def open(self, owner: Owner, conversation_id: str | None, agent: str | None, mode: str | None) -> Opened:
        self._call("open", owner, conversation_id, agent, mode)
        return await super().open(owner, conversation_id, agent, mode)

    async def command(self, owner: Owner, conversation_id: str, command: Command) -> AckStatus:
        self._call("command", owner, conversation_id, command)
        return await super().command(owner, conversation_id, command)

    async def delete(self, owner: Owner, conversation_id: str, request_id: str) -> AckStatus:
        self._call("delete", owner, conversation_id, request_id)
        self._owned(owner, conversation_id)
        del self.conversations[conversation_id]
        return "accepted"

    async def list_conversations(self, owner: Owner, limit: int, before: str | None) -> ConversationPage:
        self._call("list_conversations", owner, limit, before)
        return await super().list_conversations(owner, limit, before)

    async def export(self, owner: Owner, conversation_id: str, request_id: str) -> Export:
        self._call("export", owner, conversation_id, request_id)
        events = list(self._owned(owner, conversation_id).events)

        async def pages() -> AsyncIterator[list[Event]]:
            yield events

        return Export("accepted", len(events), pages())


class Peer:
    """A connection that notes, in order, the frames it was given and what it was told to watch and export."""

    def __init__(self, owner: Owner = ALICE, max_watched: int = 2) -> None:
        self.owner = owner
        self.caller = Caller.of(owner)   # what the connection's token lets tools know (gateway/dispatch.py Peer)
        self.trace_parent = None
        self.max_watched = max_watched
        self.watched: dict[str, int] = {}
        self.told: list[ServerFrame | tuple[Any, ...]] = []

    def send(self, frame: ServerFrame) -> None:
        self.told.append(frame)

    def can_watch(self, conversation_id: str) -> bool:
        return conversation_id in self.watched or len(self.watched) < self.max_watched

    def watching(self, conversation_id: str) -> bool:
        return conversation_id in self.watched

    def watch(self, conversation_id: str, after_seq: int) -> None:
        self.watched[conversation_id] = after_seq
        self.told.append(("watch", conversation_id, after_seq))

    def unwatch(self, conversation_id: str) -> None:
        del self.watched[conversation_id]
        self.told.append(("unwatch", conversation_id))

    def export(self, frame_id: str, conversation_id: str, export: Export) -> None:
        self.told.append(("export", frame_id, conversation_id, export.last_seq))


class Drains:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest.fixture
async def backend() -> Recorder:
    backend = Recorder()
    backend.conversations[CID] = FakeConversation(ALICE, "demo", "agent")
    await backend.emit(CID, HEAD)
    return backend


async def run(frame: ClientFrame, backend: Recorder, peer: Peer | None = None) -> tuple[Peer, Drains]:
    peer, drains = peer or Peer(), Drains()
    await dispatch(frame, peer, backend, drains)
    return peer, drains


# -- each frame type: its backend call, its reply ----------------------------------------------------

FRAMES: list[tuple[ClientFrame, list[tuple[Any, ...]], list[Any]]] = [
    (Ping(id="p1"),
     [],
     [Pong(id="p1")]),
    (Open(id="o1", conversation_id=CID),
     [("open", ALICE, CID, None, None)],
     [Ack(id="o1", status="accepted", conversation_id=CID, last_seq=HEAD)]),
    (Subscribe(id="s1", conversation_id=CID, after_seq=1),
     [("open", ALICE, CID, None, None)],
     [Ack(id="s1", status="accepted", conversation_id=CID, last_seq=HEAD, after_seq=1), ("watch", CID, 1)]),
    (Unsubscribe(id="u1", conversation_id=CID),
     [("open", ALICE, CID, None, None)],
     [Ack(id="u1", status="accepted", conversation_id=CID)]),
    (UserMessageFrame(id="m1", conversation_id=CID, text="hi"),
     [("command", ALICE, CID, UserMessage(id="m1", text="hi"))],
     [Ack(id="m1", status="accepted", conversation_id=CID)]),
    (SteerFrame(id="t1", conversation_id=CID, text="shorter"),
     [("command", ALICE, CID, Steer(id="t1", text="shorter"))],
     [Ack(id="t1", status="accepted", conversation_id=CID)]),
    (AnswerFrame(id="a1", conversation_id=CID, ask_id="k1", answer="yes"),
     [("command", ALICE, CID, Answer(id="a1", ask_id="k1", answer="yes"))],
     [Ack(id="a1", status="accepted", conversation_id=CID)]),
    (SetModeFrame(id="sm1", conversation_id=CID, mode=Mode.ASK),
     [("command", ALICE, CID, SetMode(id="sm1", mode=Mode.ASK))],
     [Ack(id="sm1", status="accepted", conversation_id=CID)]),
    (CancelFrame(id="c1", conversation_id=CID),
     [("command", ALICE, CID, Cancel(id="c1"))],
     [Ack(id="c1", status="accepted", conversation_id=CID)]),
    (DeleteFrame(id="d1", conversation_id=CID),
     [("delete", ALICE, CID, "d1")],
     [Ack(id="d1", status="accepted", conversation_id=CID)]),
    (ExportFrame(id="x1", conversation_id=CID),
     [("export", ALICE, CID, "x1")],
     [Ack(id="x1", status="accepted", conversation_id=CID, last_seq=HEAD), ("export", "x1", CID, HEAD)]),
    (ListFrame(id="l1", limit=5),
     [("list_conversations", ALICE, 5, None)],
     [ConversationsFrame(id="l1", conversations=[ConversationEntry(
         conversation_id=CID, agent="demo", created_at=0.0, last_active_at=0.0, last_seq=HEAD, title="",
         running=False)])]),
]  # fmt: skip


def test_every_client_frame_type_is_specified_here() -> None:
    assert sorted(str(type(frame).__struct_config__.tag) for frame, _, _ in FRAMES) == sorted(CLIENT_FRAME_TYPES)


@pytest.mark.parametrize(("frame", "calls", "told"), FRAMES, ids=[type(f).__struct_config__.tag for f, _, _ in FRAMES])
async def test_each_frame_type_reaches_its_backend_call_and_gets_its_reply(
    backend: Recorder, frame: ClientFrame, calls: list[tuple[Any, ...]], told: list[Any]
) -> None:
    peer, drains = await run(frame, backend)
    assert backend.calls == calls
    assert peer.told == told
    assert drains.count == 0


async def test_open_without_an_id_creates_a_conversation_for_the_caller(backend: Recorder) -> None:
    peer, _ = await run(Open(id="o1", agent="demo", mode=Mode.ASK), backend)
    assert backend.calls == [("open", ALICE, None, "demo", Mode.ASK)]
    [ack] = peer.told
    assert isinstance(ack, Ack) and ack.last_seq == 0
    assert ack.conversation_id is not None and backend.conversations[ack.conversation_id].owner == ALICE


async def test_the_ack_carries_the_backends_status(backend: Recorder) -> None:
    peer = Peer()
    for _ in range(2):
        await run(UserMessageFrame(id="m1", conversation_id=CID, text="hi"), backend, peer)
    assert [frame.status for frame in peer.told if isinstance(frame, Ack)] == ["accepted", "duplicate"]


async def test_unsubscribing_a_watched_conversation_asks_the_backend_nothing(backend: Recorder) -> None:
    peer = Peer()
    await run(Subscribe(id="s1", conversation_id=CID), backend, peer)
    backend.calls.clear()
    await run(Unsubscribe(id="u1", conversation_id=CID), backend, peer)
    assert backend.calls == []
    assert peer.told[-2:] == [("unwatch", CID), Ack(id="u1", status="accepted", conversation_id=CID)]


async def test_subscribing_beyond_the_watch_limit_is_overloaded_before_any_backend_call(backend: Recorder) -> None:
    peer = Peer(max_watched=1)
    peer.watched["c_other"] = 0
    await run(Subscribe(id="s1", conversation_id=CID), backend, peer)
    assert backend.calls == []
    assert peer.told == [ErrorFrame(code=ErrorCode.OVERLOADED, id="s1", conversation_id=CID,
                                    message="this connection already watches 1 conversations: unsubscribe one first")]


async def test_a_subscribe_the_backend_refuses_is_neither_acked_nor_watched(backend: Recorder) -> None:
    peer, _ = await run(Subscribe(id="s1", conversation_id=CID), backend, Peer(owner=BOB))
    assert peer.told == [ErrorFrame(code=ErrorCode.FORBIDDEN, message="forbidden: no such conversation for this caller",
                                    id="s1", conversation_id=CID)]
    assert peer.watched == {}


# -- each exception: its error frame ---------------------------------------------------------------


class LostOwnership(Forbidden):
    """A backend's own refinement of a refusal."""


REFUSED: list[tuple[BaseException, ClientFrame, ErrorFrame]] = [
    (Forbidden(CID),
     UserMessageFrame(id="m1", conversation_id=CID, text="hi"),
     ErrorFrame(code=ErrorCode.FORBIDDEN, message="forbidden: no such conversation for this caller",
                id="m1", conversation_id=CID)),
    (LostOwnership(CID),
     ExportFrame(id="x1", conversation_id=CID),
     ErrorFrame(code=ErrorCode.FORBIDDEN, message="forbidden: no such conversation for this caller",
                id="x1", conversation_id=CID)),
    (UnknownAgent("nobody"),
     Open(id="o1", agent="nobody"),
     ErrorFrame(code=ErrorCode.NOT_FOUND, message="unknown agent 'nobody'", id="o1")),
    (UnknownAgent("no default agent"),
     Open(id="o2"),
     ErrorFrame(code=ErrorCode.NOT_FOUND, message="no default agent", id="o2")),
    (AgentNotServed("second", CID),
     Open(id="o4", conversation_id=CID),
     ErrorFrame(code=ErrorCode.NOT_FOUND, id="o4", conversation_id=CID,
                message="unknown agent 'second': this conversation's agent is not served here")),
    (AgentNotServed("second", CID),
     UserMessageFrame(id="m3", conversation_id=CID, text="hi"),
     ErrorFrame(code=ErrorCode.NOT_FOUND, id="m3", conversation_id=CID,
                message="unknown agent 'second': this conversation's agent is not served here")),
    (InvalidCursor("before: not a cursor of this server (pass a page's next_before)"),
     ListFrame(id="l2", limit=5, before="forged"),
     ErrorFrame(code=ErrorCode.BAD_REQUEST, id="l2",
                message="before: not a cursor of this server (pass a page's next_before)")),
    (UnknownAsk("k9"),
     AnswerFrame(id="a1", conversation_id=CID, ask_id="k9", answer="yes"),
     ErrorFrame(code=ErrorCode.NOT_FOUND, id="a1", conversation_id=CID,
                message="no question is waiting for this ask_id (answered, timed out, or never asked)")),
    (QuotaExceeded(Quota.TURNS_PER_MINUTE, Scope.USER, 3, 1_800_000_000.0),
     UserMessageFrame(id="m2", conversation_id=CID, text="hi"),
     ErrorFrame(code=ErrorCode.QUOTA_EXCEEDED, id="m2", conversation_id=CID,
                message="quota exceeded: turns_per_minute per user (limit 3); resets at 2027-01-15T08:00:00Z",
                quota="turns_per_minute", scope="user", resets_at="2027-01-15T08:00:00Z")),
    (QuotaExceeded(Quota.OPEN_CONVERSATIONS, Scope.TENANT, 5),
     Open(id="o3"),
     ErrorFrame(code=ErrorCode.QUOTA_EXCEEDED, id="o3",
                message="quota exceeded: open_conversations per tenant (limit 5); frees up as conversations are deleted",
                quota="open_conversations", scope="tenant")),
    (StoreUnavailable("failover", retry_after_ms=1500),
     UserMessageFrame(id="m4", conversation_id=CID, text="hi"),
     ErrorFrame(code=ErrorCode.UNAVAILABLE, id="m4", conversation_id=CID, retry_after_ms=1500,
                message="store unavailable: failover; frame not processed, send it again (same id) after 1500 ms")),
    (StoreUnavailable("disk full"),
     Open(id="o5"),
     ErrorFrame(code=ErrorCode.UNAVAILABLE, id="o5", retry_after_ms=1000,
                message="store unavailable: disk full; frame not processed, send it again (same id) after 1000 ms")),
    (StoreUnavailable("restart", retry_after_ms=250),
     Subscribe(id="s2", conversation_id=CID),
     ErrorFrame(code=ErrorCode.UNAVAILABLE, id="s2", conversation_id=CID, retry_after_ms=250,
                message="store unavailable: restart; frame not processed, send it again (same id) after 250 ms")),
    (StoreUnavailable("lock timeout"),
     ListFrame(id="l3", limit=5),
     ErrorFrame(code=ErrorCode.UNAVAILABLE, id="l3", retry_after_ms=1000,
                message="store unavailable: lock timeout; frame not processed, send it again (same id) after 1000 ms")),
]  # fmt: skip


@pytest.mark.parametrize(("raised", "frame", "error"), REFUSED, ids=[type(r).__name__ for r, _, _ in REFUSED])
async def test_each_refusal_is_its_error_frame_and_nothing_else(
    backend: Recorder, raised: BaseException, frame: ClientFrame, error: ErrorFrame
) -> None:
    backend.fail = raised
    peer, drains = await run(frame, backend)
    assert peer.told == [error]  # no ack, no watch: the frame was not acted on
    assert drains.count == 0


async def test_a_replaced_configuration_gets_no_reply_and_drains_the_replica(backend: Recorder) -> None:
    # docs/design.md#generations: the client sends the frame again, same id, to a current replica.
    backend.fail = ConfigurationReplaced("old", "new")
    peer, drains = await run(UserMessageFrame(id="m1", conversation_id=CID, text="hi"), backend)
    assert peer.told == []
    assert drains.count == 1


async def test_an_unexpected_failure_is_internal_with_a_ref_and_only_the_log_has_the_details(
    backend: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    backend.fail = RuntimeError("secret internal detail /srv/reactgate/db.sqlite3")
    with caplog.at_level(logging.ERROR, "reactgate.gateway"):
        peer, drains = await run(UserMessageFrame(id="m1", conversation_id=CID, text="hi"), backend)
    [error] = peer.told
    assert isinstance(error, ErrorFrame)
    assert (error.code, error.id, error.conversation_id) == (ErrorCode.INTERNAL, "m1", CID)
    ref = re.fullmatch(r"internal error \(ref ([0-9a-f]{12})\)", error.message)
    assert ref is not None
    [record] = caplog.records
    assert ref.group(1) in record.getMessage() and record.exc_info is not None
    assert "secret internal detail" in caplog.text
    assert drains.count == 0


async def test_a_closed_socket_is_not_answered(backend: Recorder) -> None:
    backend.fail = ConnectionClosed(None, None)
    peer = Peer()
    with pytest.raises(ConnectionClosed):
        await run(UserMessageFrame(id="m1", conversation_id=CID, text="hi"), backend, peer)
    assert peer.told == []


# -- a store outage: unavailable, never internal (docs/wire-protocol.md#5-error-codes) ----------------


async def test_a_store_outage_is_unavailable_with_its_cause_and_no_ref_and_logs_no_error(
    backend: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    assert REFUSALS[StoreUnavailable] is not REFUSALS[Exception]
    backend.fail = StoreUnavailable("failover", retry_after_ms=2000)
    with caplog.at_level(logging.DEBUG, "reactgate.gateway"):
        peer, drains = await run(UserMessageFrame(id="m1", conversation_id=CID, text="hi"), backend)
    [error] = peer.told
    assert isinstance(error, ErrorFrame)
    assert (error.code, error.id, error.conversation_id, error.retry_after_ms) == (ErrorCode.UNAVAILABLE, "m1", CID, 2000)
    assert "failover" in error.message and "ref" not in error.message
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # an outage is no bug of this frame
    assert drains.count == 0


async def test_the_same_frame_sent_again_after_the_outage_is_acked(backend: Recorder) -> None:
    frame = UserMessageFrame(id="m1", conversation_id=CID, text="hi")
    peer = Peer()
    backend.fail = StoreUnavailable("failover")
    await run(frame, backend, peer)
    backend.fail = None
    await run(frame, backend, peer)
    assert [type(f).__name__ for f in peer.told] == ["ErrorFrame", "Ack"]
    assert peer.told[-1] == Ack(id="m1", status="accepted", conversation_id=CID)


@pytest.mark.parametrize(("cause", "shown"), [
    ("failover", "failover"),
    ("connection refused\n  at db:5432\x00", "connection refused at db:5432"),
    ("", "unknown cause"),
    ("x" * 500, "x" * 119 + "…"),
])  # fmt: skip
def test_the_cause_reaches_the_wire_as_one_short_line(cause: str, shown: str) -> None:
    assert safe_cause(cause) == shown


def test_the_frontends_answer_unavailable_with_503_and_retry_after() -> None:
    # docs/frontends.md: the body is the error frame /ws would send; Retry-After in whole seconds, rounded up.
    assert STATUS[ErrorCode.UNAVAILABLE] is HTTPStatus.SERVICE_UNAVAILABLE
    frame = ErrorFrame(code=ErrorCode.UNAVAILABLE, message="m", retry_after_ms=1500)
    assert retry_after(frame) == [("Retry-After", "2")]
    assert retry_after(ErrorFrame(code=ErrorCode.UNAVAILABLE, message="m", retry_after_ms=0)) == [("Retry-After", "0")]
    assert retry_after(ErrorFrame(code=ErrorCode.OVERLOADED, message="m")) == []
