"""States and the availability matrix (docs/design.md#states), ask mode (#ask-mode), UI commands (#ui-commands), uses_code,
and the event-log invariants (#event-log), each through LiteLLM with a scripted model."""

from __future__ import annotations

from protocol.notices import NoticeCode
from tests.convkit import (
    action,
    answer_round,
    call,
    harness,
    rounds_script,
    text_round,
    thinking,
    tool_round,
)


async def test_write_note_is_denied_in_state_default_and_allowed_after_focus_project_in_the_same_turn() -> None:
    h = harness(rounds_script(
        tool_round("demo.write_note", text="remember the milk"),      # default: not available
        tool_round("demo.focus_project", name="groceries"),
        tool_round("demo.write_note", text="remember the milk"),      # focused: the very next round
        answer_round("Noted."),
    ))
    done = await h.turn("note: remember the milk")

    assert h.notice_codes()[0] == [NoticeCode.TOOL_UNAVAILABLE]
    assert h.named("tool.call", round=1) == []
    assert h.conv.state.agent_state == "focused"
    [note] = h.results("demo.write_note")
    assert note["ok"] is True and note["result"] == {"stored": True, "count": 1}
    assert h.workspace()["notes"] == ["remember the milk"]
    assert done["reason"] == "complete" and done["finish_ok"] is True
    # The system prompt's tool list and state follow the state from the next round on.
    assert "demo.write_note" not in h.calls[0].tools() and "demo.write_note" not in h.calls[1].tools()
    assert "demo.write_note" in h.calls[2].tools()
    assert "Current state: default." in h.calls[1].system
    assert "Current state: focused." in h.calls[2].system
    h.check_invariants()


async def test_write_tool_is_denied_in_ask_mode_never_executed_and_works_again_in_agent_mode() -> None:
    h = harness(rounds_script(
        tool_round("demo.focus_project", name="groceries"),
        tool_round("demo.write_note", text="remember the milk"),      # ask mode: ASK_MODE_DENIED
        tool_round("react.ask_user", question="Switch to agent mode so I can write the note?"),
        tool_round("demo.write_note", text="remember the milk"),      # agent mode again
        answer_round("Noted."),
    ), mode="ask")

    def back_to_agent_mode(e: object) -> None:
        assert h.workspace().get("notes") is None                   # never executed while in ask mode
        h.conv.set_mode("agent")
        assert h.conv.answer(e.data.ask_id, "done")  # type: ignore[union-attr]

    h.when("ask_user", back_to_agent_mode)
    done = await h.turn("note: remember the milk")

    assert h.notice_codes()[1] == [NoticeCode.ASK_MODE_DENIED]
    assert h.rounds()[1]["denied"] == [{"index": 0, "code": NoticeCode.ASK_MODE_DENIED, "tool_id": "demo.write_note"}]
    assert [r["round"] for r in h.named("tool.call", tool_id="demo.write_note")] == [4]
    assert h.workspace()["notes"] == ["remember the milk"]
    assert done["reason"] == "complete"
    # Focused state, ask mode: the write tool is absent from the list; back in agent mode it returns.
    assert "Mode: ask" in h.calls[1].system and "demo.write_note" not in h.calls[1].tools()
    assert "demo.write_note" not in h.calls[2].tools()
    assert "Mode: agent" in h.calls[3].system and "demo.write_note" in h.calls[3].tools()
    h.check_invariants()


async def test_ask_mode_is_sticky_across_turns() -> None:
    h = harness(rounds_script(
        tool_round("demo.focus_project", name="groceries"),
        answer_round("Focused."),
        tool_round("demo.write_note", text="x"),
        tool_round("demo.clock"),
        answer_round("I cannot write in ask mode."),
    ), mode="ask")
    await h.turn("focus groceries")
    done = await h.turn("write x")

    assert h.notice_codes("t2")[0] == [NoticeCode.ASK_MODE_DENIED]
    assert h.workspace().get("notes") is None
    assert done["reason"] == "complete"
    h.check_invariants()


async def test_ui_commands_of_a_tool_result_become_ui_command_events() -> None:
    h = harness(rounds_script(tool_round("demo.open_tab", name="report"), answer_round("Opened the report tab.")))
    await h.turn("open the report")

    assert h.named("ui_command") == [{"turn_id": "t1", "command": "open_tab", "args": {"name": "report"}}]
    [result] = h.results("demo.open_tab")
    assert result["result"] == {"opened": "report"}                 # the commands travel as events only
    names = h.names()
    assert names.index("tool.result") < names.index("ui_command") < names.index("turn.completed")
    h.check_invariants()


async def test_uses_code_tool_gets_the_code_channel() -> None:
    h = harness(rounds_script(
        text_round(thinking("Computing."), action(call("demo.eval")), "<channel:code>2 + 3 * (4 - 1)</channel:code>"),
        answer_round("It is 11."),
    ))
    await h.turn("what is 2 + 3 * (4 - 1)?")

    [result] = h.results("demo.eval")
    assert result["ok"] is True and result["result"] == {"value": 11}
    assert "<channel:code>2 + 3 * (4 - 1)</channel:code>" in h.calls[1].text()   # the call as the model wrote it
    h.check_invariants()


async def test_code_channel_without_a_uses_code_tool_is_a_channels_violation() -> None:
    h = harness(rounds_script(
        text_round(thinking("Computing."), action(call("demo.clock")), "<channel:code>1 + 1</channel:code>"),
        tool_round("demo.clock"),
        answer_round("Done."),
    ))
    await h.turn("time?")

    assert NoticeCode.CHANNELS in h.notice_codes()[0]
    h.check_invariants()


async def test_event_seqs_are_contiguous_and_every_call_has_one_result_across_turns() -> None:
    h = harness(rounds_script(
        text_round(thinking("Two lookups."), action(call("demo.weather", city="Paris")),
                   action(call("demo.weather", city="Atlantis"))),
        answer_round("Rain in Paris; Atlantis unknown."),
        tool_round("demo.clock"),
        answer_round("It is 2026."),
    ))
    await h.turn("weather in paris and atlantis?")
    await h.turn("and the time?")

    assert [d["ok"] for d in h.results("demo.weather")] == [True, False]
    assert h.events[-1].event == "turn.completed" and h.events[-1].seq == len(h.events)
    assert h.conv.events.last_seq == len(h.events)
    h.check_invariants()


async def test_coalesced_deltas_carry_the_same_text_and_keep_seqs_contiguous() -> None:
    script = rounds_script(
        {**tool_round("demo.weather", city="Paris"), "chunk_chars": 2},
        {**answer_round("It is raining in Paris, 12 °C. Take an umbrella."), "chunk_chars": 1, "delay_ms": 1},
    )
    each = harness(script)
    await each.turn("weather?")
    coalesced = harness(script, flush_interval_ms=25)
    await coalesced.turn("weather?")

    for lane in ("thinking.delta", "answer.delta"):
        assert coalesced.text(lane) == each.text(lane)
    assert len(coalesced.named("answer.delta")) < len(each.named("answer.delta"))
    assert [e.event for e in coalesced.events if not e.event.endswith(".delta")] == \
        [e.event for e in each.events if not e.event.endswith(".delta")]
    coalesced.check_invariants()


async def test_the_step_ledger_reaches_the_system_prompt_and_a_tiny_budget_keeps_the_latest_observation() -> None:
    h = harness(rounds_script(
        tool_round("demo.search", query="paris weather"),
        tool_round("demo.weather", city="Paris"),
        answer_round("Rain in Paris."),
    ), context_budget_tokens=50, count_tokens=lambda msgs: sum(len(m["content"]) for m in msgs) // 4)
    done = await h.turn("weather in paris?")

    assert done["reason"] == "complete"
    last = h.calls[-1]
    assert "Steps so far (2):" in last.system and "2. demo.weather [" in last.system
    assert last.messages[-1]["content"].startswith("[observation] demo.weather")
    assert '"condition": "rain"' in last.messages[-1]["content"]
    assert {"role": "user", "content": "weather in paris?"} in last.messages
    assert any(m["content"].startswith("[summary]") for m in last.messages)   # the search result was folded
    h.check_invariants()
