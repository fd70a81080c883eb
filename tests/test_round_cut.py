"""A round cut from outside (provider error, crash) is not the model's mistake (docs/design.md#notices, guarantee 4)."""

from __future__ import annotations

from actors.round import RoundEngine, RoundOutcome
from protocol.notices import Notice, NoticeCode
from tests.roundkit import action, call, rules, thinking

CUT = Notice(code=NoticeCode.PROVIDER_ERROR, message="the model provider failed (server_error)")


def _cut_after(text: str) -> tuple[list[str], RoundOutcome]:
    engine = RoundEngine(rules(), turn_id="t1", round_no=1)
    engine.feed(text)
    _, result = engine.finish(cut=CUT)
    return [str(n.code) for n in result.notices], result.outcome


def test_cut_inside_an_action_block_reports_only_the_cut() -> None:
    codes, outcome = _cut_after(thinking() + '<channel:action>{"action": "call_tool", "tool_c')
    assert codes == [NoticeCode.PROVIDER_ERROR]
    assert outcome is RoundOutcome.RETRY


def test_cut_before_any_byte_reports_only_the_cut() -> None:
    codes, _ = _cut_after("")
    assert codes == [NoticeCode.PROVIDER_ERROR]


def test_a_closed_invalid_action_before_the_cut_is_still_reported() -> None:
    written = thinking() + action(call("demo.search", query="x", junk=1)) + "<channel:action>{"
    codes, _ = _cut_after(written)
    assert codes == [NoticeCode.TOOL_CALL_INVALID, NoticeCode.PROVIDER_ERROR]
