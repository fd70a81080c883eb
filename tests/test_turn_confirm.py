"""Execute confirmation in a turn (docs/design.md#execute-confirmation): a call of a `confirm` tool
waits for the user's approval through the ask_user protocol; approved it runs once, denied or
unanswered it never runs and the model reads why; "approve all" covers the rest of the turn only."""

from __future__ import annotations

from typing import Any

from actors.turn_machine import APPROVAL_OPTIONS, APPROVE, APPROVE_ALL, DENY
from protocol.notices import NoticeCode
from tests.convkit import Harness, answer_round, harness, profile_for, rounds_script, script_model, tool_round

FOCUS = tool_round("demo.focus_project", name="groceries")


def note(text: str) -> dict[str, Any]:
    return tool_round("demo.write_note", text=text)


def confirming(*rounds: dict[str, Any], mode: str = "agent", **policies: Any) -> Harness:
    """The demo agent with `confirm_writes = true`: demo.write_note (a write tool) asks first."""
    profile = profile_for(script_model(rounds_script(*rounds, loop=True)), **policies)
    return harness(profile=profile.model_copy(update={"confirm_writes": True}), mode=mode)


def approvals(h: Harness) -> list[dict[str, Any]]:
    return h.named("ask_user", kind="approval")


def notes(h: Harness) -> list[Any]:
    return list(h.workspace().get("notes", []))


async def test_an_approved_call_runs_once_after_the_user_says_yes() -> None:
    h = confirming(FOCUS, note("milk"), answer_round("Noted."))
    h.answer_asks(APPROVE)
    done = await h.turn("note milk")

    [asked] = approvals(h)
    assert (asked["tool_id"], asked["params"], asked["options"]) == ("demo.write_note", {"text": "milk"},
                                                                      list(APPROVAL_OPTIONS))
    assert asked["ask_id"] == h.named("tool.call", tool_id="demo.write_note")[0]["call_id"]
    assert [t["decision"] for t in h.traces("approval")] == ["approved"]
    assert len(notes(h)) == 1 and [r["ok"] for r in h.results("demo.write_note")] == [True]
    # The approval came before the call ran: the question precedes its result in the log.
    names = h.names()
    assert names.index("ask_user") < names.index("trace", names.index("ask_user")) < len(names)
    assert done["final_answer"] == "Noted."
    h.check_invariants()


async def test_a_denied_call_never_runs_and_the_model_reads_that_the_user_said_no() -> None:
    h = confirming(FOCUS, note("milk"), answer_round("I did not write it."))
    h.answer_asks(DENY)
    await h.turn("note milk")

    [result] = h.results("demo.write_note")
    assert result["ok"] is False and result["error"] == "denied_by_user" and result["detail"]["decision"] == "denied"
    assert notes(h) == []
    assert '"error": "denied_by_user"' in h.calls[2].text()
    h.check_invariants()


async def test_an_unanswered_approval_times_out_and_the_call_never_runs() -> None:
    h = confirming(FOCUS, note("milk"), answer_round("Nobody answered."), ask_user_timeout_s=0.05)
    await h.turn("note milk")

    [result] = h.results("demo.write_note")
    assert result["error"] == "denied_by_user" and result["detail"]["decision"] == "timeout"
    assert notes(h) == [] and [t["decision"] for t in h.traces("approval")] == ["timeout"]


async def test_anything_but_an_offered_approval_denies() -> None:
    h = confirming(FOCUS, note("milk"), answer_round("Not written."))
    h.answer_asks("sure, whatever")
    await h.turn("note milk")
    assert notes(h) == [] and h.results("demo.write_note")[0]["error"] == "denied_by_user"


async def test_approve_all_covers_the_rest_of_the_turn_and_not_the_next() -> None:
    h = confirming(FOCUS, note("milk"), note("eggs"), answer_round("Both noted."))
    h.answer_asks(APPROVE_ALL)
    await h.turn("note milk and eggs")
    assert len(approvals(h)) == 1 and len(notes(h)) == 2

    h.send("once more")            # the next turn asks again, call by call
    for n in range(2):
        asked = await h.wait_event("ask_user", turn_id="t2", kind="approval", ask_id=f"t2.{n + 2}.0")
        assert h.conv.answer(asked.data.ask_id, APPROVE)  # type: ignore[union-attr]
    await h.idle()
    assert len(approvals(h)) == 3 and len(notes(h)) == 4
    h.check_invariants()


async def test_ask_mode_still_hides_write_tools_and_asks_nothing() -> None:
    h = confirming(FOCUS, note("milk"), answer_round("Read-only here."), mode="ask")
    await h.turn("note milk")
    assert approvals(h) == [] and notes(h) == []
    assert h.notice_codes()[1] == [NoticeCode.ASK_MODE_DENIED]


async def test_a_tool_that_needs_no_confirmation_runs_unasked() -> None:
    h = confirming(FOCUS, tool_round("demo.weather", city="Paris"), answer_round("Rain."))
    await h.turn("weather")
    assert approvals(h) == [] and h.results("demo.weather")[0]["ok"] is True
