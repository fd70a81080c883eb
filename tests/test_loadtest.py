"""`reactgate loadtest` (README.md#configuration): the seq tracker, one simulated user on the client
session, percentiles and the report without sockets; the loopback-only rule; then the real console
script against a real gateway on 127.0.0.1, with abrupt reconnects, which must find nothing lost,
duplicated or out of order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from client.loadtest.report import CURVE_X_MAX, Series, percentile_curve, render_html, summarize, svg_chart
from client.loadtest.runner import LoadConfig, NotLoopback, Result, ScriptInfo, require_loopback
from client.loadtest.user import (
    MAX_TRACKED_GAP,
    Seen,
    SeqTracker,
    SimUser,
    Stats,
    new_histogram,
    record_seconds,
)
from client.session import RETRY_PAUSE_S
from gateway.app import build_backend
from gateway.cli import main as cli_main
from gateway.server import GatewayServer
from gateway.settings import Settings
from protocol.events import (
    AnswerDelta,
    AskUser,
    EndReason,
    Event,
    EventData,
    Salvaged,
    ThinkingDelta,
    TurnCompleted,
    TurnStarted,
)
from protocol.frames import (
    Ack,
    AnswerFrame,
    ClientFrame,
    ErrorCode,
    ErrorFrame,
    Open,
    Subscribe,
    UserMessageFrame,
    encode_event,
    encode_frame,
)

REPO = Path(__file__).resolve().parents[1]
CID = "c_test"

# -- the seq tracker ----------------------------------------------------------------------------


def observe_all(tracker: SeqTracker, seqs: list[int]) -> list[Seen]:
    return [tracker.observe(s) for s in seqs]


def test_an_in_order_stream_has_nothing_lost_duplicated_or_out_of_order() -> None:
    t = SeqTracker()
    assert set(observe_all(t, list(range(1, 101)))) == {Seen.NEW}
    assert (t.lost, t.duplicated, t.out_of_order, t.received, t.last) == (0, 0, 0, 100, 100)


def test_a_seq_received_twice_is_a_duplicate() -> None:
    t = SeqTracker()
    assert observe_all(t, [1, 2, 3, 2, 3]) == [Seen.NEW] * 3 + [Seen.DUPLICATE] * 2
    assert (t.duplicated, t.out_of_order, t.lost, t.received) == (2, 0, 0, 3)


def test_a_gap_never_filled_is_lost() -> None:
    t = SeqTracker()
    observe_all(t, [1, 2, 5, 6])
    assert (t.lost, t.duplicated, t.out_of_order, t.last) == (2, 0, 0, 6)


def test_a_gap_filled_late_is_out_of_order_not_lost() -> None:
    t = SeqTracker()
    assert observe_all(t, [1, 3, 2]) == [Seen.NEW, Seen.NEW, Seen.OUT_OF_ORDER]
    assert (t.lost, t.out_of_order, t.duplicated, t.received) == (0, 1, 0, 3)
    assert t.observe(2) is Seen.DUPLICATE  # filled once; a second copy is a repeat


def test_resuming_after_the_last_seen_seq_expects_no_overlap() -> None:
    """The resume subscribes after `last`: a server that honours it produces no duplicate; one that
    replays the last seen event again (an overlap of one) is caught as a duplicate."""
    honest, overlapping = SeqTracker(), SeqTracker()
    for t in (honest, overlapping):
        observe_all(t, [1, 2, 3, 4])                       # ... then the connection drops
    observe_all(honest, list(range(honest.last + 1, 9)))  # subscribe(after_seq=4) → 5..8
    observe_all(overlapping, list(range(overlapping.last, 9)))  # a server replaying 4..8
    assert (honest.duplicated, honest.lost, honest.out_of_order) == (0, 0, 0)
    assert (overlapping.duplicated, overlapping.lost, overlapping.out_of_order) == (1, 0, 0)


def test_settle_counts_the_events_up_to_the_head_that_never_arrived() -> None:
    t = SeqTracker()
    observe_all(t, [1, 2, 3])
    t.settle(head=3)
    assert t.lost == 0
    t.settle(head=7)
    assert t.lost == 4


def test_a_huge_jump_is_counted_without_remembering_every_seq() -> None:
    t = SeqTracker()
    t.observe(1)
    t.observe(MAX_TRACKED_GAP * 3)
    assert len(t.missing) == MAX_TRACKED_GAP
    assert t.lost == MAX_TRACKED_GAP * 3 - 2


# -- percentiles ----------------------------------------------------------------------------------


def test_percentiles_of_a_known_distribution_within_histogram_precision() -> None:
    hist = new_histogram()
    for ms in range(1, 1001):
        record_seconds(hist, ms / 1000)
    s = summarize(hist)
    assert s.count == 1000
    assert s.p50 == pytest.approx(500, rel=0.01)
    assert s.p95 == pytest.approx(950, rel=0.01)
    assert s.p99 == pytest.approx(990, rel=0.01)
    assert s.max == pytest.approx(1000, rel=0.01)


def test_an_empty_histogram_summarizes_to_no_values() -> None:
    s = summarize(new_histogram())
    assert s.count == 0 and s.p99 != s.p99  # NaN
    assert percentile_curve(new_histogram()) == []


def test_a_negative_duration_is_clamped_not_an_error() -> None:
    hist = new_histogram()
    record_seconds(hist, -0.5)  # a clock step between the server's ts and our receive time
    assert hist.get_total_count() == 1


def test_the_percentile_curve_rises_and_ends_at_the_max() -> None:
    hist = new_histogram()
    for ms in (1, 2, 3, 5, 8, 13, 21, 34, 55, 89):
        record_seconds(hist, ms / 1000)
    curve = percentile_curve(hist)
    xs, ys = [x for x, _ in curve], [y for _, y in curve]
    assert xs == sorted(xs) and ys == sorted(ys)
    assert curve[-1] == (CURVE_X_MAX, pytest.approx(89, rel=0.01))


# -- loopback only ----------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "ws://example.com/ws", "ws://localhost:8765/ws", "ws://10.0.0.1:8765/ws", "ws://0.0.0.0:8765/ws",
    "wss://[2001:db8::1]/ws", "http://127.0.0.1:8765/ws", "ws:///ws", "ws://127.0.0.1:99999/ws",
])
def test_a_url_that_is_not_a_loopback_literal_is_refused(url: str) -> None:
    with pytest.raises(NotLoopback):
        require_loopback(url)


@pytest.mark.parametrize("url", ["ws://127.0.0.1:8765/ws", "ws://127.1.2.3/ws", "ws://[::1]:8765/ws",
                                 "wss://127.0.0.1/ws"])
def test_a_loopback_literal_is_accepted(url: str) -> None:
    assert require_loopback(url) == url


def test_the_cli_refuses_a_remote_host_with_a_clear_error_before_any_traffic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["loadtest", "--url", "ws://example.com:8765/ws", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert "refusing to send load to 'example.com'" in err and "127.0.0.1" in err


def test_the_cli_refuses_the_remote_host_before_reading_the_script(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    assert cli_main(["loadtest", "--url", "ws://example.com/ws", "--script", str(tmp_path / "missing.json")]) == 2
    assert "refusing to send load to 'example.com'" in capsys.readouterr().err


def test_the_cli_rejects_a_bad_script_naming_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps({"rounds": "not a list"}))
    assert cli_main(["loadtest", "--script", str(script), "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reactgate loadtest: ") and "bad.json" in err


# -- one simulated user, without sockets ------------------------------------------------------------


def event(seq: int, data: EventData, wall: float = 1000.0) -> bytes:
    return encode_event(Event.of(CID, seq, data, wall))


def ack(frame_id: str, **fields: Any) -> bytes:
    return encode_frame(Ack(id=frame_id, status=fields.pop("status", "accepted"), **fields))


def error(code: ErrorCode, message: str = "no", **fields: Any) -> bytes:
    return encode_frame(ErrorFrame(code=code, message=message, **fields))


def started(turn_id: str, message_id: str) -> TurnStarted:
    return TurnStarted(turn_id=turn_id, user_message_id=message_id)


def thinking(turn_id: str = "t1", text: str = "Look") -> ThinkingDelta:
    return ThinkingDelta(turn_id=turn_id, round=1, text=text)


def completed(turn_id: str = "t1", reason: EndReason = EndReason.COMPLETE) -> TurnCompleted:
    return TurnCompleted(turn_id=turn_id, reason=reason, final_answer="It rains.", used_tools=True, finish_ok=True)


class Driver:
    """A SimUser with predictable ids and a hand-moved clock."""

    def __init__(self, send_until: float = 100.0) -> None:
        self.stats = Stats()
        counter = itertools.count(1)
        self.user = SimUser(self.stats, send_until=send_until, started_at=0.0, new_id=lambda: f"f{next(counter)}")
        self.mono = 0.0

    def recv(self, raw: bytes, wall: float = 1000.0) -> list[Any]:
        return self.user.receive(raw, self.mono, wall)

    def open(self, last_seq: int = 0) -> list[Any]:
        [opened] = self.user.connected()
        assert isinstance(opened, Open)
        return self.recv(ack(opened.id, conversation_id=CID, last_seq=last_seq))


def test_a_user_opens_subscribes_and_sends_its_first_message() -> None:
    d = Driver()
    [opened] = d.user.connected()
    assert opened == Open(id="f1", conversation_id=None)
    subscribe, message = d.recv(ack("f1", conversation_id=CID, last_seq=0))
    assert subscribe == Subscribe(id="f2", conversation_id=CID, after_seq=0)
    assert isinstance(message, UserMessageFrame) and message.conversation_id == CID
    assert d.stats.turns_started == 1


def test_time_to_first_delta_is_measured_from_the_message_to_the_turns_first_delta() -> None:
    d = Driver()
    _, message = d.open()
    d.mono = 0.2
    d.recv(event(1, started("t1", message.id)))
    d.mono = 0.5
    d.recv(event(2, thinking("t1", "Look")))
    d.mono = 0.9
    d.recv(event(3, AnswerDelta(turn_id="t1", round=2, text="It is")))
    ttfd = summarize(d.stats.ttfd)
    assert ttfd.count == 1 and ttfd.max == pytest.approx(500, rel=0.01)


def test_a_completed_turn_starts_the_next_one_until_the_duration_is_over() -> None:
    d = Driver(send_until=10.0)
    _, first = d.open()
    d.recv(event(1, started("t1", first.id)))
    d.mono = 2.0
    [second] = d.recv(event(2, completed("t1")))
    assert isinstance(second, UserMessageFrame) and second.id != first.id
    d.recv(event(3, started("t2", second.id)))
    d.mono = 11.0
    [verify] = d.recv(event(4, completed("t2")))
    assert isinstance(verify, Open) and verify.conversation_id == CID  # asks for the head
    assert (d.stats.turns_started, d.stats.turns_completed) == (2, 2)
    assert not d.user.finished
    d.recv(ack(verify.id, conversation_id=CID, last_seq=4))
    assert d.user.finished and d.user.tracker.lost == 0


def test_events_still_owed_at_the_end_are_awaited_then_counted_lost_if_they_never_come() -> None:
    d = Driver(send_until=1.0)
    _, message = d.open()
    d.recv(event(1, started("t1", message.id)))
    d.mono = 2.0
    [verify] = d.recv(event(2, completed("t1")))
    d.recv(ack(verify.id, conversation_id=CID, last_seq=4))   # the head is further: wait
    assert not d.user.finished
    d.recv(event(3, Salvaged(turn_id="t1", round=2, answer_chars=9)))
    assert not d.user.finished
    d.user.abandon()                                           # the run's hard deadline
    assert d.user.tracker.lost == 1


def test_a_failed_turn_is_counted_apart_from_completed_ones() -> None:
    d = Driver()
    _, message = d.open()
    d.recv(event(1, started("t1", message.id)))
    d.recv(event(2, completed("t1", EndReason.PROTOCOL_VIOLATION)))
    assert (d.stats.turns_completed, d.stats.turns_failed) == (0, 1)
    assert d.stats.reasons == {"protocol_violation": 1}


def test_an_ask_user_is_answered_with_its_first_option() -> None:
    d = Driver()
    _, message = d.open()
    d.recv(event(1, started("t1", message.id)))
    [answer] = d.recv(event(2, AskUser(turn_id="t1", ask_id="a1", question="Go on?",
                                       options=["Continue exploring", "Stop for now"], timeout_s=300)))
    assert isinstance(answer, AnswerFrame)
    assert (answer.ask_id, answer.answer, answer.conversation_id) == ("a1", "Continue exploring", CID)
    assert d.stats.asks_answered == 1


def test_a_user_chosen_for_a_cut_asks_for_it_at_its_first_answer_delta_after_the_moment_and_only_once() -> None:
    d = Driver()
    d.user.cut_after = 1.0
    _, message = d.open()
    d.recv(event(1, started("t1", message.id)))
    d.mono = 0.5
    d.recv(event(2, AnswerDelta(turn_id="t1", round=2, text="It ")))
    assert not d.user.cut_due                                    # before the moment
    d.mono = 1.5
    d.recv(event(3, thinking()))
    assert not d.user.cut_due                                    # not an answer: not mid-answer
    d.recv(event(4, AnswerDelta(turn_id="t1", round=2, text="rains")))
    assert d.user.cut_due and d.user.cut_after is None
    d.user.cut_due = False                                       # the shell cut the connection
    d.recv(event(5, AnswerDelta(turn_id="t1", round=2, text=".")))
    assert not d.user.cut_due


def test_the_cut_fraction_is_a_fraction() -> None:
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="--cut-fraction"):
            LoadConfig(cut_fraction=bad).check()


def test_the_ramp_up_ends_before_the_duration() -> None:
    for bad in (-1.0, 10.0):
        with pytest.raises(ValueError, match="--ramp-up"):
            LoadConfig(duration_s=10.0, ramp_up_s=bad).check()


def test_after_a_drop_the_user_resumes_after_its_last_seq_and_resends_the_unacked_message_with_its_id() -> None:
    d = Driver()
    _, message = d.open()
    d.recv(event(1, started("t1", message.id)))
    d.recv(event(2, thinking()))
    d.user.disconnected()                                        # the message was never acked
    subscribe, resent = d.open(last_seq=5)
    assert subscribe.after_seq == 2
    assert resent == message                                     # same id: the server dedupes it
    d.recv(ack(resent.id, status="duplicate", conversation_id=CID))
    assert (d.stats.resent, d.stats.duplicate_acks) == (1, 1)
    d.recv(ack(subscribe.id, conversation_id=CID, last_seq=5, after_seq=2))
    for seq in (3, 4, 5):                                        # the backlog, replayed once
        d.recv(event(seq, thinking(text="ing"), wall=1000.0), wall=1002.0)
    d.recv(event(6, thinking(text="."), wall=1003.0), wall=1003.01)
    assert summarize(d.stats.resume_delivery).count == 3
    assert summarize(d.stats.delivery).max == pytest.approx(10, rel=0.01)  # only the live ones
    t = d.user.tracker
    assert (t.lost, t.duplicated, t.out_of_order) == (0, 0, 0)


def test_an_acked_message_is_not_resent_after_a_drop() -> None:
    d = Driver()
    _, message = d.open()
    d.recv(ack(message.id, conversation_id=CID))
    d.user.disconnected()
    assert d.open() == [Subscribe(id="f5", conversation_id=CID, after_seq=0)]


def test_a_rate_limited_command_is_sent_again_after_a_pause() -> None:
    d = Driver()
    _, message = d.open()
    d.recv(error(ErrorCode.RATE_LIMITED, "slow down", id=message.id))
    assert d.user.due(RETRY_PAUSE_S / 2) == []
    assert d.user.due(RETRY_PAUSE_S) == [message]
    assert d.stats.errors == {"rate_limited": 1}


def test_a_slow_consumer_error_resubscribes_after_the_last_seen_seq() -> None:
    d = Driver()
    d.open()
    d.recv(event(1, started("t9", "someone-else")))
    [again] = d.recv(error(ErrorCode.SLOW_CONSUMER, "paused", conversation_id=CID, last_seq=1))
    assert again == Subscribe(id=again.id, conversation_id=CID, after_seq=1)


def test_a_forbidden_open_stops_the_user() -> None:
    d = Driver()
    [opened] = d.user.connected()
    d.recv(error(ErrorCode.FORBIDDEN, "no", id=opened.id))
    assert d.user.finished and d.user.fatal is not None and "forbidden" in d.user.fatal


def test_a_gap_on_the_wire_is_counted_and_the_session_resubscribes_to_fill_it() -> None:
    d = Driver()
    subscribe, message = d.open()
    d.recv(ack(subscribe.id, conversation_id=CID, last_seq=0, after_seq=0))
    d.recv(event(1, started("t1", message.id)))
    [again] = d.recv(event(3, thinking()))           # seq 2 never came on this subscription
    assert again == Subscribe(id=again.id, conversation_id=CID, after_seq=1)
    d.recv(ack(again.id, conversation_id=CID, last_seq=3, after_seq=1))
    d.recv(event(2, thinking()))
    d.recv(event(3, thinking()))
    t = d.user.tracker
    assert (t.lost, t.out_of_order, t.duplicated) == (0, 1, 1)  # the server broke its promise: counted
    assert d.user.session.last_seq == 3 and d.stats.events == 3    # each event counted once, in order


def test_events_of_another_conversation_are_counted_as_errors() -> None:
    d = Driver()
    d.open()
    frames: list[ClientFrame] = d.recv(encode_event(Event.of("c_other", 1, thinking(), 1000.0)))
    assert frames == [] and d.stats.errors == {"client.foreign_event": 1} and d.user.tracker.received == 0


# -- the report -------------------------------------------------------------------------------------


def test_the_svg_chart_is_well_formed_xml_with_one_line_per_series() -> None:
    svg = svg_chart("a <title> & more", [Series("a", "#000", [(0, 1), (1, 2)]), Series("b", "#f00", [(0, 3)])],
                    x_max=1, x_ticks=[(0, "0"), (1, "1")], x_label="x", y_label="y")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2


def one_turn_result(script_info: ScriptInfo | None = None) -> Result:
    d = Driver()
    _, message = d.open()
    d.recv(event(1, started("t1", message.id)))
    d.recv(event(2, AnswerDelta(turn_id="t1", round=1, text="It rains.")))
    d.mono = 200.0  # past the duration: no next turn
    [head_check] = d.recv(event(3, completed("t1")))
    d.recv(ack(head_check.id, conversation_id=CID, last_seq=3))  # the server's head: all of it arrived
    assert d.user.verified
    return Result(LoadConfig(duration_s=1), d.stats, [d.user], elapsed_s=1.0, script_info=script_info)


def test_the_html_report_is_self_contained_and_shows_the_correctness_counts() -> None:
    page = render_html(one_turn_result())
    assert page.count("<svg") == 4
    assert "PASS: no event lost" in page
    assert '<tr><th>duplicated</th><td class="ok">0</td></tr>' in page
    assert not re.search(r"""(src|href)=["']?https?:""", page)  # no CDN, nothing fetched
    assert "$" not in page  # every placeholder of the template was filled


def test_the_html_report_describes_the_script_it_was_given() -> None:
    info = ScriptInfo("demo <1>.json", rounds=2, loop=True, chunks_per_round=(3, 4))
    page = render_html(one_turn_result(info))
    assert "Script demo &lt;1&gt;.json: 2 round(s) (loops), chunks per round [3, 4], 7 chunks per pass." in page


# -- end to end: the console script against a real gateway ----------------------------------------


def loadtest_command() -> list[str]:
    script = Path(sys.executable).with_name("reactgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway.cli"]


@contextlib.asynccontextmanager
async def demo_gateway(tmp_path: Path) -> Any:
    backend = build_backend(Settings(backend="local", port=0, store=f"sqlite:///{tmp_path}/lt.sqlite3"))
    server = GatewayServer(Settings(host="127.0.0.1", port=0, backend="local"), backend)
    _, port = await server.start()
    try:
        yield port
    finally:
        await server.drain()


async def run_loadtest(port: int, *args: str) -> tuple[int, str, dict[str, str]]:
    """The console script against the gateway on `port`: exit code, stdout, and its counts line."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "REACTGATE_TOKEN")}
    env |= {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_COLOR": "1", "TERM": "dumb"}
    proc = await asyncio.create_subprocess_exec(
        *loadtest_command(), "loadtest", "--url", f"ws://127.0.0.1:{port}/ws", *args, cwd=REPO, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out_b, err_b = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out = out_b.decode()
    assert proc.returncode is not None
    lines = [line for line in out.splitlines() if line.startswith("lost=")]
    assert lines, out + err_b.decode()
    return proc.returncode, out + err_b.decode(), dict(re.findall(r"(\w+)=(\d+)", lines[0]))


@pytest.mark.slow
async def test_loadtest_with_abrupt_reconnects_finds_nothing_lost_duplicated_or_out_of_order(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    async with demo_gateway(tmp_path) as port:
        code, out, counts = await run_loadtest(
            port, "--conversations", "4", "--duration", "3", "--reconnect-rate", "1", "--drain-timeout", "20",
            "--seed", "1", "--report", str(report))
    assert code == 0, out
    assert (counts["lost"], counts["duplicated"], counts["out_of_order"]) == ("0", "0", "0")
    assert int(counts["turns"]) > 0 and counts["incomplete_turns"] == "0"
    assert int(counts["reconnects"]) > 0, "the run should have dropped connections"
    assert "PASS" in out
    page = report.read_text(encoding="utf-8")
    assert "<svg" in page and '<tr><th>lost</th><td class="ok">0</td></tr>' in page


@pytest.mark.slow
async def test_a_cut_fraction_cuts_exactly_that_many_users_mid_answer_and_they_resume_whole(tmp_path: Path) -> None:
    async with demo_gateway(tmp_path) as port:
        code, out, counts = await run_loadtest(
            port, "--conversations", "4", "--duration", "3", "--cut-fraction", "0.5", "--drain-timeout", "20",
            "--seed", "2")
    assert code == 0, out
    assert counts["reconnects"] == "2"
    assert (counts["lost"], counts["duplicated"], counts["out_of_order"], counts["garbled_turns"]) == ("0",) * 4


# -- an honest load tester: a deliberately faulty server must fail the run -------------------------


class FaultyServer:
    """Just enough of the wire protocol for one simulated user, on loopback: open, subscribe and a
    turn per `user_message` ("It rains." in two deltas) — with one `fault` of the server's own."""

    def __init__(self, fault: str | None) -> None:
        self.fault = fault
        self.log: list[bytes] = []          # the conversation's events, in seq order

    def _emit(self, data: EventData) -> bytes:
        raw = encode_event(Event.of(CID, len(self.log) + 1, data, time.time()))
        self.log.append(raw)
        return raw

    async def handle(self, ws: Any) -> None:
        from protocol.frames import decode_client_frame

        async for raw in ws:
            frame = decode_client_frame(raw)
            head = len(self.log)
            match frame:
                case Open():
                    lying = 3 if self.fault == "unverified" and frame.conversation_id else 0
                    await ws.send(ack(frame.id, conversation_id=CID, last_seq=head + lying))
                case Subscribe():
                    await ws.send(ack(frame.id, last_seq=head))
                    for event_raw in self.log[frame.after_seq:]:
                        await ws.send(event_raw)
                case UserMessageFrame():
                    await ws.send(ack(frame.id))
                    turn = f"t{head + 1}"
                    final = "It snows." if self.fault == "garbled" else "It rains."
                    for data in (started(turn, frame.id), AnswerDelta(turn_id=turn, round=1, text="It "),
                                 AnswerDelta(turn_id=turn, round=1, text="rains."),
                                 TurnCompleted(turn_id=turn, reason=EndReason.COMPLETE, final_answer=final,
                                               used_tools=False, finish_ok=True)):
                        await ws.send(self._emit(data))
                    if self.fault == "foreign":
                        await ws.send(encode_event(Event.of("c_someone_else", 1, thinking(turn), 1000.0)))
                    if self.fault == "unreadable":
                        await ws.send(b"\x00this is not a frame")
                case _:
                    pass


@pytest.mark.parametrize(("fault", "named"), [
    (None, None),
    ("foreign", "foreign_events="),
    ("unreadable", "unreadable_frames="),
    ("unverified", "unverified_users=1"),
    ("garbled", "garbled_turns="),
])
async def test_the_load_tester_fails_a_faulty_server_and_names_the_fault(
    fault: str | None, named: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    from websockets.asyncio.server import serve

    from client.loadtest.command import run_loadtest

    server = FaultyServer(fault)
    async with serve(server.handle, "127.0.0.1", 0) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        config = LoadConfig(url=f"ws://127.0.0.1:{port}/ws", conversations=1, duration_s=0.3, drain_timeout_s=1.5)
        code = await asyncio.to_thread(run_loadtest, config)
    out = capsys.readouterr().out
    if named is None:
        assert code == 0 and "PASS" in out, out       # the same server without its fault passes
    else:
        assert code == 1 and "FAIL" in out and named in out, out
