"""Native function calling through a real gateway on loopback (docs/design.md#native), played by the
scripted model's native rounds: the built-in native demo, and a turn a server fault cut mid-answer
that a fresh server continues from exactly what streamed (docs/design.md#recovery)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from actors.profile import BUILTIN_DIR, load_profile
from actors.tools.demo import demo_registry
from tests.e2e import as_frames, check_log, comparable, local_server

DEMO_NATIVE = load_profile(BUILTIN_DIR / "demo_native.toml", known_tools=demo_registry())


def native_script(*rounds: dict[str, Any], continues: bool = False) -> dict[str, Any]:
    return {"rounds": list(rounds), "continues": continues}


def weather_call() -> dict[str, Any]:
    return {"native": [{"text": "Let me check."},
                       {"call": {"name": "demo_weather", "arguments": {"city": "Paris"}}, "split": [4, 9]}]}


async def test_the_native_demo_calls_its_tool_and_streams_its_answer(tmp_path: Path) -> None:
    demo = json.loads((BUILTIN_DIR / "demo_native_script.json").read_text())
    async with local_server(tmp_path / "s.sqlite3", demo, profile=DEMO_NATIVE) as server, server.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, "What's the weather in Paris?", id="m1")
        done = await c.turn_completed(cid)
        events = c.events[cid]
    check_log(events)
    answer = "".join(e["data"]["text"] for e in events if e["event"] == "answer.delta")
    assert done["data"]["final_answer"] == answer and answer.startswith("It is raining in Paris")
    assert "Let me check the weather in Paris." not in answer
    [called] = [e["data"] for e in events if e["event"] == "tool.call"]
    assert (called["tool_id"], called["params"]) == ("demo.weather", {"city": "Paris"})
    assert "Let me check the weather in Paris." in "".join(
        e["data"]["text"] for e in events if e["event"] == "thinking.delta")


async def test_a_native_answer_cut_by_a_server_fault_is_continued_never_regenerated(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite3"
    answer = "Rain in Paris all day long, twelve degrees, bring an umbrella and a coat. " * 3
    # 80 of the answer's 222 characters, then silence: the drain below always cuts the answer there
    streaming = native_script(weather_call(), {"native": [{"text": answer}], "chunk_chars": 4, "hang_after": 20},
                              continues=True)
    profile = DEMO_NATIVE.model_copy(update={"policies": DEMO_NATIVE.policies.model_copy(
        update={"preamble_hold_chars": 20})})
    async with local_server(store, streaming, profile=profile) as first, first.client() as c:
        cid = await c.open()
        await c.subscribe(cid)
        await c.say(cid, id="m1")
        await c.event(cid, "answer.delta")
        await first.server.drain()
        await c.closed()
    seen = list(c.events[cid])
    before = "".join(e["data"]["text"] for e in seen if e["event"] == "answer.delta")
    assert 0 < len(before) < len(answer)

    async with local_server(store, streaming, profile=profile) as second, second.client() as c:
        await c.subscribe(cid, after_seq=seen[-1]["seq"])
        done = await c.turn_completed(cid)
        union = seen + c.events[cid]
        assert comparable(union) == comparable(as_frames(await second.log(cid)))
    check_log(union)
    streamed = "".join(e["data"]["text"] for e in union if e["event"] == "answer.delta")
    assert streamed == answer                                  # each character once: nothing repeated
    assert (done["data"]["reason"], done["data"]["final_answer"]) == ("complete", answer)
    assert [e["data"]["turn_id"] for e in union if e["event"] == "turn.completed"] == ["t1"]
