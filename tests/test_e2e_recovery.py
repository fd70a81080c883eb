"""A turn cut by a server going away resumes on a fresh server over the same store (docs/design.md#recovery),
in-process: the server drains (as on SIGTERM) in the middle of a round, a new one starts on the
same SQLite file, and the client that re-subscribes from its last seq sees the turn end exactly once.
(`test_e2e_process.py` does the same with real processes, SIGKILL and SIGTERM.)"""

from __future__ import annotations

from pathlib import Path

from protocol.frames import CloseCode
from tests.e2e import (
    action,
    as_frames,
    call,
    check_log,
    comparable,
    complete,
    local_server,
    script,
    text_round,
    thinking,
)

# A first server's round goes silent part-way (`hang_after` deltas of 4 characters) and never ends by
# itself, so the drain that follows always cuts it there, however slow the machine: no race against the
# stream. The second server's calls have the next call indexes, which play the rounds after it.
CHECK_WEATHER = thinking("Let me check the forecast for Paris before I answer. " * 3) + action(call("demo.weather", city="Paris"))
SLOW_THINKING_THEN_WEATHER = script(
    text_round(CHECK_WEATHER, chunk_chars=4, hang_after=20),    # 80 of the thinking's 177 characters
    text_round(CHECK_WEATHER, chunk_chars=4),
    text_round(thinking("Answering."), action(complete("Rain in Paris, 12 °C."))),
)
ANSWER = "Rain in Paris all day long, twelve degrees, bring an umbrella and a coat. " * 3


def answering(**fields: object) -> dict[str, object]:
    """The round that answers: 111 characters of thinking and action before the answer's first."""
    return text_round(thinking("Answering."), action(complete(ANSWER)), chunk_chars=4, **fields)


async def test_a_round_cut_before_any_answer_is_decided_again_after_round_interrupted(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite3"
    async with local_server(store, SLOW_THINKING_THEN_WEATHER) as first, first.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.event(cid, "thinking.delta")
        await first.server.drain()  # cuts round 1 mid-thinking: no tool call, no answer yet
        closed = await c.closed()
        assert closed.rcvd is not None and closed.rcvd.code == CloseCode.SERVICE_RESTART
    seen = list(c.events[cid])
    assert "tool.call" not in [e["event"] for e in seen]

    async with local_server(store, SLOW_THINKING_THEN_WEATHER) as second, second.client() as c:
        await c.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await c.turn_completed(cid)
        union = seen + c.events[cid]
        assert comparable(union) == comparable(as_frames(await second.log(cid)))
    check_log(union)
    interrupted = [e for e in union if e["event"] == "round.completed" and e["data"].get("interrupted")]
    assert [[n["code"] for n in e["data"]["notices"]] for e in interrupted] == [["round_interrupted"]]
    assert [e["data"]["turn_id"] for e in union if e["event"] == "turn.completed"] == ["t1"]
    assert (done["data"]["reason"], done["data"]["final_answer"], done["data"]["finish_ok"]) == (
        "complete", "Rain in Paris, 12 °C.", True)


async def test_a_round_cut_after_the_answer_streamed_is_continued_never_regenerated_nor_cut(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite3"
    streaming = script(
        text_round(thinking("Checking."), action(call("demo.weather", city="Paris"))),
        answering(hang_after=40),  # 49 characters of the answer, then silence
    )
    streaming["continues"] = True   # a model that, asked to continue, continues where it stopped
    async with local_server(store, streaming) as first, first.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.event(cid, "answer.delta")
        await first.server.drain()
        await c.closed()
    seen = list(c.events[cid])
    before = "".join(e["data"]["text"] for e in seen if e["event"] == "answer.delta")
    assert 0 < len(before) < len(ANSWER)

    async with local_server(store, streaming) as second, second.client() as c:
        await c.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await c.turn_completed(cid)
        union = seen + c.events[cid]
        assert comparable(union) == comparable(as_frames(await second.log(cid)))
    check_log(union)
    streamed = "".join(e["data"]["text"] for e in union if e["event"] == "answer.delta")
    assert streamed == ANSWER                                  # each character once: nothing repeated
    assert (done["data"]["reason"], done["data"]["final_answer"]) == ("complete", ANSWER)
    assert "partial" not in done["data"]
    assert [e["data"]["turn_id"] for e in union if e["event"] == "turn.completed"] == ["t1"]
    assert [e["data"]["round"] for e in union if e["event"] == "round.completed"] == [1, 2]


async def test_a_cut_round_whose_continuation_starts_over_ends_partial(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite3"
    streaming = script(text_round(thinking("Checking."), action(call("demo.weather", city="Paris"))),
                       answering(hang_after=40),           # 49 characters of the answer, then silence
                       answering())                        # asked to continue, it plays its next round
    async with local_server(store, streaming) as first, first.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.event(cid, "answer.delta")
        await first.server.drain()
        await c.closed()
    seen = list(c.events[cid])

    async with local_server(store, streaming) as second, second.client() as c:
        await c.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await c.turn_completed(cid)
        union = seen + c.events[cid]
    check_log(union)
    streamed = "".join(e["data"]["text"] for e in union if e["event"] == "answer.delta")
    assert 0 < len(streamed) < len(ANSWER) and ANSWER.startswith(streamed)
    assert (done["data"]["reason"], done["data"]["final_answer"], done["data"]["partial"]) == ("salvaged", streamed, True)
