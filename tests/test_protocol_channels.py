"""The channel parser and the prefix policy (docs/design.md#decision-protocol): block-level tags only, any chunking."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.actions import ActionType, Finish
from protocol.channels import (
    ActionClosed,
    ActionFailed,
    ActionTyped,
    AnswerText,
    BlockClosed,
    BlockOpened,
    BlockText,
    Channel,
    ChannelParser,
    ChannelViolation,
    ParserEvent,
)
from protocol.prefix import OPENING, PREVIEW_CHARS, PrefixPolicy
from tests.roundkit import action, call, chunks, complete, thinking


def parse(deltas: list[str]) -> tuple[ChannelParser, list[ParserEvent]]:
    parser = ChannelParser()
    events: list[ParserEvent] = []
    for delta in deltas:
        events += parser.feed(delta)
    events += parser.finish()
    return parser, events


def violations(events: list[ParserEvent]) -> list[str]:
    return [e.message for e in events if isinstance(e, ChannelViolation)]


def text_of(events: list[ParserEvent], channel: Channel) -> str:
    return "".join(e.text for e in events if isinstance(e, BlockText) and e.channel is channel)


def answer_of(events: list[ParserEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, AnswerText))


def closed_actions(events: list[ParserEvent]) -> list[ActionClosed]:
    return [e for e in events if isinstance(e, ActionClosed)]


# -- block structure -----------------------------------------------------------------------------


def test_well_formed_response_has_no_violations() -> None:
    raw = thinking("Looking.") + action(call("demo.clock")) + "<channel:summary>s</channel:summary>"
    _, events = parse(chunks(raw, 5))
    assert violations(events) == []
    assert [type(e).__name__ for e in events if not isinstance(e, BlockText)] == [
        "BlockOpened", "BlockClosed", "BlockOpened", "ActionTyped", "ActionClosed", "BlockOpened", "BlockClosed",
    ]
    assert text_of(events, Channel.THINKING) == "Looking."


def test_thinking_must_come_first() -> None:
    _, events = parse([action(complete("x")) + thinking()])
    assert "thinking must come first, exactly once" in violations(events)
    assert not [e for e in events if isinstance(e, BlockOpened)]


def test_thinking_exactly_once() -> None:
    _, events = parse([thinking("one") + thinking("two") + action(complete("x"))])
    assert violations(events) == ["thinking must come first, exactly once"]
    assert text_of(events, Channel.THINKING) == "one"


def test_whitespace_between_blocks_is_allowed() -> None:
    _, events = parse(["\n " + thinking() + " \n\t " + action(complete("x")) + "\n"])
    assert violations(events) == []


def test_text_between_blocks_is_a_violation() -> None:
    _, events = parse([thinking() + "Here it is: " + action(complete("x"))])
    assert violations(events) == ["text outside the channel blocks"]


def test_unknown_channel_is_a_violation_and_swallowed() -> None:
    _, events = parse([thinking() + "<channel:notes>hidden</channel:notes>" + action(complete("x"))])
    assert violations(events) == ["unknown channel <channel:notes>"]
    assert "hidden" not in str(events)


def test_out_of_order_action_after_code_is_swallowed() -> None:
    raw = thinking() + action(call("demo.eval")) + "<channel:code>1</channel:code>" + action(complete("late"))
    _, events = parse([raw])
    assert violations(events) == ["action blocks must come before code and summary"]
    assert len(closed_actions(events)) == 1
    assert answer_of(events) == ""


def test_at_most_one_code_block() -> None:
    raw = thinking() + action(call("demo.eval")) + "<channel:code>1</channel:code><channel:code>2</channel:code>"
    _, events = parse([raw])
    assert violations(events) == ["at most one code block"]
    assert text_of(events, Channel.CODE) == "1"


def test_at_most_one_summary_block() -> None:
    raw = thinking() + action(complete("x")) + "<channel:summary>a</channel:summary><channel:summary>b</channel:summary>"
    _, events = parse([raw])
    assert violations(events) == ["at most one summary block"]
    assert text_of(events, Channel.SUMMARY) == "a"


@pytest.mark.parametrize("cut", [5, 10, 30])
def test_unclosed_block_at_end_of_stream(cut: int) -> None:
    _, events = parse([thinking("x" * 40)[: len("<channel:thinking>") + cut]])
    assert violations(events) == ["block <channel:thinking> was not closed"]


def test_unclosed_ignored_block_is_reported_by_its_own_name() -> None:
    _, events = parse([thinking() + thinking()[:25]])
    assert violations(events)[-1] == "block <channel:thinking> was not closed"


def test_unclosed_action_block_finishes_its_decoder() -> None:
    _, events = parse([thinking() + '<channel:action>{"action": "complete", "final_answer": "par'])
    assert "block <channel:action> was not closed" in violations(events)
    [closed] = closed_actions(events)
    assert closed.action is None and closed.cut
    assert answer_of(events) == "par"


# -- tags are tags only at the block level ---------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4, 10**9])
def test_tag_inside_json_string_is_text(size: int) -> None:
    answer = 'Write </channel:action> then <channel:thinking> and ```json {"a": 1}```'
    raw = thinking() + action(complete(answer)) + "<channel:summary>s</channel:summary>"
    _, events = parse(chunks(raw, size))
    assert violations(events) == []
    assert answer_of(events) == answer
    assert text_of(events, Channel.SUMMARY) == "s"


@pytest.mark.parametrize("size", [1, 4, 10**9])
def test_tag_like_text_inside_code_channel_is_text(size: int) -> None:
    code = "1 </channel:action> <channel:thinking> </channel:code"
    raw = thinking() + action(call("demo.eval")) + f"<channel:code>{code}</channel:code>"
    _, events = parse(chunks(raw, size))
    assert violations(events) == []
    assert text_of(events, Channel.CODE) == code


@pytest.mark.parametrize("size", [1, 2, 10**9])
def test_tag_like_text_inside_thinking_is_text(size: int) -> None:
    text = "a <b> </channel:action> <channel:action> </channel:thinkin x"
    _, events = parse(chunks(thinking(text) + action(complete("x")), size))
    assert violations(events) == []
    assert text_of(events, Channel.THINKING) == text


def test_a_stray_lt_in_action_json_is_a_decoder_error() -> None:
    _, events = parse([thinking() + '<channel:action>{"action": <b>}</channel:action>'])
    assert [e for e in events if isinstance(e, ActionFailed)] == [ActionFailed(0, "invalid JSON: unexpected '<'")]
    assert closed_actions(events) == [ActionClosed(0, None, ("invalid JSON: unexpected '<'",))]


# -- incremental delivery -------------------------------------------------------------------------


def test_only_a_possible_tag_start_is_held_back() -> None:
    parser = ChannelParser()
    parser.feed("<channel:thinking>")
    assert parser.feed("abc </chan") == [BlockText(Channel.THINKING, "abc ")]
    assert parser.feed("nel:thinking>") == [BlockClosed(Channel.THINKING)]


def test_held_text_that_is_not_a_tag_is_released() -> None:
    parser = ChannelParser()
    parser.feed("<channel:thinking>")
    assert parser.feed("a </chan") == [BlockText(Channel.THINKING, "a ")]
    assert parser.feed("ge") == [BlockText(Channel.THINKING, "</change")]


def test_action_typed_and_answer_text_events() -> None:
    parser = ChannelParser()
    parser.feed(thinking())
    assert parser.feed('<channel:action>{"action": "complete",') == [
        BlockOpened(Channel.ACTION, 0), ActionTyped(0, ActionType.COMPLETE, None),
    ]
    assert parser.feed(' "final_answer": "Par') == [AnswerText(0, "Par")]
    assert parser.feed('is"}</channel:action>') == [
        AnswerText(0, "is"), ActionClosed(0, Finish(ActionType.COMPLETE, "Paris"), ()),
    ]


def test_action_blocks_are_numbered_in_order() -> None:
    raw = thinking() + action(call("demo.clock")) + action(complete("x"))
    _, events = parse([raw])
    assert [e.index for e in events if isinstance(e, BlockOpened) and e.channel is Channel.ACTION] == [0, 1]


@pytest.mark.parametrize("ensure_ascii", [True, False])
def test_unicode_escapes_and_surrogate_pairs_split_across_deltas(ensure_ascii: bool) -> None:
    answer = "naïve 😀 𝄞"
    body = json.dumps(complete(answer), ensure_ascii=ensure_ascii)
    raw = thinking() + action(body)
    for size in (1, 2, 3, 5, 7):
        _, events = parse(chunks(raw, size))
        assert answer_of(events) == answer


# -- the same events at any chunking ----------------------------------------------------------------

ANSWER_PIECES = ['"', "\\", "\\n", "\\u00e9", "\\ud83d\\ude00", "\\ud83d", "é", "😀", "\x00", "<", "</channel:action>",
                 "<channel:thinking>", "```", "{", "}", " "]
BLOCK_PIECES = ["<", "</", "<channel:", "</channel:action>", "<channel:action>", "</channel:thinking>",
                "<channel:summary>", "</channel:summary>", "```json\n", "\n```", "{", "}", '"', "\\", " ", "\n", "x"]
answer_texts = st.lists(st.one_of(st.text(max_size=8), st.sampled_from(ANSWER_PIECES)), max_size=10).map("".join)


@st.composite
def responses(draw: st.DrawFn) -> str:
    """Well-formed responses whose answers hold escapes and tag-like text, sometimes with
    block-level noise spliced in or cut short."""
    answer = draw(answer_texts)
    body = json.dumps(complete(answer), ensure_ascii=draw(st.booleans()))
    raw = thinking(draw(answer_texts).replace("<", " ")) + action(body)
    noise = draw(st.lists(st.sampled_from(BLOCK_PIECES), max_size=3))
    at = draw(st.integers(0, len(raw)))
    raw = raw[:at] + "".join(noise) + raw[at:]
    return raw[: draw(st.integers(0, len(raw)))] if draw(st.booleans()) else raw


def merged(events: list[ParserEvent]) -> list[ParserEvent]:
    """Text of one block (or answer) in one event, and a violation said once in a row: what a
    chunking may change, and nothing else."""
    out: list[ParserEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, BlockText) and isinstance(last, BlockText) and last.channel is event.channel:
            out[-1] = BlockText(event.channel, last.text + event.text)
        elif isinstance(event, AnswerText) and isinstance(last, AnswerText) and last.index == event.index:
            out[-1] = AnswerText(event.index, last.text + event.text)
        elif not (isinstance(event, ChannelViolation) and event == last):
            out.append(event)
    return out


@settings(max_examples=300, deadline=None)
@given(raw=responses(), data=st.data())
def test_events_do_not_depend_on_the_chunking(raw: str, data: st.DataObject) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=12))))
    pieces = [raw[a:b] for a, b in itertools.pairwise([0, *cuts, len(raw)])]
    whole = merged(parse([raw])[1])
    assert merged(parse(list(raw))[1]) == whole
    assert merged(parse(pieces)[1]) == whole


# -- the prefix policy ------------------------------------------------------------------------------


def admit_all(deltas: list[str]) -> list[bool]:
    policy = PrefixPolicy()
    return [policy.admit(d) for d in deltas]


def test_preamble_leading_whitespace_allowed() -> None:
    assert admit_all([" \n", "\t ", OPENING, "text"]) == [True, True, True, True]


def test_preamble_split_tag_allowed() -> None:
    assert admit_all(["<", "chan", "nel:thin", "king", ">", "anything <at all>"]) == [True] * 6


def test_preamble_rejected_at_first_impossible_delta() -> None:
    assert admit_all(["<chan", "nel:thinkin", "g >", OPENING]) == [True, True, False, False]


def test_preamble_opening_tag_with_text_in_one_delta() -> None:
    assert admit_all(["  <channel:thinking>hello", "Sure!"]) == [True, True]


def test_preamble_other_channel_first_rejected() -> None:
    assert admit_all(["<channel:action>"]) == [False]


def test_preamble_preview_ends_at_the_first_impossible_character() -> None:
    policy = PrefixPolicy()
    policy.admit("  <channel:thinkXng>" + "y" * 500)
    assert policy.preview() == "<channel:thinkX"
    assert len(policy.preview()) <= PREVIEW_CHARS
