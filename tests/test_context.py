"""Context assembly within the token budget and the step ledger (docs/design.md#context) — pure, no model."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from actors.context import (
    LEDGER_MAX_CHARS,
    PromptCounts,
    Step,
    assemble,
    ledger_summary,
    params_digest,
    system_prompt,
)
from actors.gates import EXPLORATION_MARKER
from actors.tools.demo import demo_registry
from protocol.timeline import (
    FinalBlock,
    NoticeBlock,
    SteerBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessageBlock,
)

SYSTEM = "You are an agent. " + "Follow the protocol. " * 20


def count(messages: Sequence[Mapping[str, str]]) -> int:
    return sum(len(m["content"]) for m in messages) // 4


def history(turns: int) -> list[object]:
    """`turns` finished turns, each: user message, thinking, a search call and its (large) result, answer."""
    blocks: list[object] = []
    for t in range(1, turns + 1):
        tid = f"t{t}"
        blocks += [
            UserMessageBlock(tid, f"m{t}", f"question number {t}"),
            ThinkingBlock(tid, 1, f"Searching for {t}."),
            ToolCallBlock(tid, 1, f"{tid}.1.0", "demo.search", {"query": f"q{t}"}),
            ToolResultBlock(tid, f"{tid}.1.0", "demo.search", True, {"results": [f"result {t}-{i}" for i in range(40)]}),
            ThinkingBlock(tid, 2, "Answering."),
            FinalBlock(tid, f"answer {t}", "complete"),
        ]
    return blocks


def current_turn(observation_size: int = 60) -> list[object]:
    return [
        UserMessageBlock("t9", "m9", "the current question, which must stay whole"),
        ThinkingBlock("t9", 1, "Looking."),
        ToolCallBlock("t9", 1, "t9.1.0", "demo.weather", {"city": "Paris"}),
        ToolResultBlock("t9", "t9.1.0", "demo.weather", True, {"city": "Paris", "notes": ["rain"] * observation_size}),
    ]


def test_each_prompt_counts_only_the_messages_the_last_one_did_not() -> None:
    """PromptCounts: a conversation's next prompt is its last one plus the newest messages; only
    those are counted, and a message no prompt used since is forgotten (the memory is one prompt's)."""
    counted: list[str] = []

    def counting(messages: Sequence[Mapping[str, str]]) -> int:
        counted.extend(m["content"] for m in messages)
        return count(messages)

    counts = PromptCounts(counting)
    first = assemble(SYSTEM, history(2), turn_id="t9", budget_tokens=100_000, count_tokens=counts.next_prompt())
    assert sorted(counted) == sorted(m["content"] for m in first)          # each counted once
    counted.clear()
    second = assemble(SYSTEM, history(2) + current_turn(), turn_id="t9", budget_tokens=100_000,
                      count_tokens=counts.next_prompt())
    new = [m["content"] for m in second if m not in first]
    assert len(new) == 3 and sorted(counted) == sorted(new)                 # the current turn's, alone
    counted.clear()
    assemble(SYSTEM, current_turn(), turn_id="t9", budget_tokens=100_000, count_tokens=counts.next_prompt())
    assert counted == []                                                    # all counted by the last prompt
    fourth = assemble(SYSTEM, history(1), turn_id="t9", budget_tokens=100_000, count_tokens=counts.next_prompt())
    again = [m["content"] for m in fourth[1:]]                              # the first prompt's, not the last's
    assert len(again) == 4 and all(m in first for m in fourth) and sorted(counted) == sorted(again)


def test_everything_fits_under_a_generous_budget() -> None:
    blocks = history(2) + current_turn()
    messages = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=100_000, count_tokens=count)
    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert not any(m["content"].startswith("[summary]") for m in messages)
    assert sum(1 for m in messages if m["content"].startswith("[observation]")) == 3


def test_tiny_budget_keeps_system_prompt_user_message_and_latest_observation_whole() -> None:
    blocks = history(6) + current_turn()
    full = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=10**9, count_tokens=count)
    budget = count(full) // 2
    messages = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=budget, count_tokens=count)

    assert messages[0] == {"role": "system", "content": SYSTEM}
    assert {"role": "user", "content": "the current question, which must stay whole"} in messages
    latest = json.dumps({"city": "Paris", "notes": ["rain"] * 60}, ensure_ascii=False)
    assert messages[-1] == {"role": "user", "content": f"[observation] demo.weather (t9.1.0): {latest}"}
    assert count(messages) <= budget
    assert len(messages) < len(full)


def test_folded_blocks_become_one_summary_that_keeps_the_last_folded_tool_json_verbatim() -> None:
    blocks = history(6) + current_turn()
    full = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=10**9, count_tokens=count)
    messages = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=count(full) // 2, count_tokens=count)

    summaries = [m for m in messages if m["content"].startswith("[summary]")]
    assert len(summaries) == 1 and messages[1] is summaries[0]          # the oldest go first, into one summary
    kept_observations = {m["content"] for m in messages if m["content"].startswith("[observation]")}
    folded_payloads = [
        json.dumps(b.payload, ensure_ascii=False) for b in blocks
        if isinstance(b, ToolResultBlock) and not any(json.dumps(b.payload, ensure_ascii=False) in k
                                                      for k in kept_observations)
    ]
    assert folded_payloads, "the budget must fold at least one observation"
    assert summaries[0]["content"].endswith(folded_payloads[-1])        # the last folded tool JSON, verbatim
    # Oldest first: the earliest question is gone, the latest kept ones are a suffix of the full list.
    assert {"role": "user", "content": "question number 1"} not in messages
    assert messages[2:] == full[len(full) - len(messages) + 2:]


def test_a_budget_smaller_than_the_required_blocks_still_keeps_them() -> None:
    blocks = history(3) + current_turn(observation_size=500)
    messages = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=10, count_tokens=count)
    assert messages[0]["content"] == SYSTEM
    assert any(m["content"] == "the current question, which must stay whole" for m in messages)
    assert '"notes": ["rain"' in messages[-1]["content"] and messages[-1]["content"].endswith('"rain"]}')


def test_previous_turns_messages_are_not_required_but_a_steer_of_this_turn_is() -> None:
    blocks = [*history(4), *current_turn()[:1],
              SteerBlock("t9", "only Paris", "<channel:thinking>Looking at all"),
              NoticeBlock("t9", 1, {"code": "finish.illegal", "message": "no"})]
    messages = assemble(SYSTEM, blocks, turn_id="t9", budget_tokens=1, count_tokens=count)
    contents = [m["content"] for m in messages]
    assert any(c.startswith("[steer] The user interrupted you: only Paris") for c in contents)
    assert "<channel:thinking>Looking at all" in next(c for c in contents if c.startswith("[steer]"))
    assert "question number 1" not in contents


def test_ledger_summary_stays_under_1500_chars_and_keeps_the_latest_steps() -> None:
    steps = [Step("demo.search", params_digest({"query": f"q{i}"}), i % 3 != 0) for i in range(500)]
    summary = ledger_summary(steps)
    assert len(summary) <= LEDGER_MAX_CHARS
    assert summary.startswith("Steps so far (500):")
    assert f"500. demo.search [{steps[-1].params_digest}] ok" in summary
    assert "earlier steps" in summary
    assert ledger_summary([]) == ""
    for n in range(1, 120):                                             # the marker never pushes it over
        assert len(ledger_summary(steps[:n])) <= LEDGER_MAX_CHARS
    assert len(ledger_summary([Step("x" * 3000, "d", True)])) <= LEDGER_MAX_CHARS


def test_params_digest_is_canonical() -> None:
    assert params_digest({"a": 1, "b": [2, 3]}) == params_digest({"b": [2, 3], "a": 1})
    assert params_digest({"a": 1}) != params_digest({"a": 2})


def test_system_prompt_teaches_the_protocol_and_lists_the_tools_with_schemas_and_traits() -> None:
    catalog = demo_registry().catalog()
    tools = [d for d in catalog if d.tool_id in ("demo.search", "demo.eval", "demo.focus_project")]
    prompt = system_prompt(agent="demo", state="default", mode="agent", tools=tools, max_actions=2,
                           exploration_cap=7, allow_no_tool=False, ledger="Steps so far (1):\n1. x [y] ok")
    assert prompt.count("<channel:thinking>") >= 2                       # the rules and the worked example
    assert "- demo.search (trait=exploration, safety=safe)" in prompt
    assert "uses_code" in prompt and "changes state" in prompt
    assert '"query"' in prompt                                          # the params schema
    assert "at most 2" in prompt and "7 per turn" in prompt and EXPLORATION_MARKER in prompt
    assert "Observe before you finish" in prompt
    assert prompt.endswith("Steps so far (1):\n1. x [y] ok")
    assert "demo.write_note" not in prompt
