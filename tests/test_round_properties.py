"""Hypothesis properties of the governed round (docs/design.md#one-decoder, #gates, #streamed-state).

Responses are generated valid and invalid: thinking with tag-like noise, one to three actions
(tool calls with valid or invalid params, complete/exit with hostile answers), fence habits, junk
keys, code and summary blocks, an optional preamble and an optional truncation. Each response is
played whole and in two random chunkings.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.gates import GateStatus
from actors.round import RoundEvent, RoundResult
from protocol.channels import AnswerText, ChannelParser
from protocol.events import AnswerDelta
from protocol.notices import NoticeCode
from protocol.prefix import OPENING, PREVIEW_CHARS
from tests import roundkit
from tests.roundkit import merged, rules

# ROUND_PROPERTY_EXAMPLES=5000 for a longer hunt; the default keeps the file to a few seconds.
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("ROUND_PROPERTY_EXAMPLES", "250")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# -- generating responses ------------------------------------------------------------------------

TAG_NOISE = ["<", ">", "</", "<channel:", "</channel:action>", "<channel:action>", "</channel:thinkin",
             "```", "```json", "\\", '"', "{", "}", "é", "😀", " ", "\n"]
ANSWER_NOISE = ['"', "\\", "\\n", "</channel:action>", "<channel:thinking>", "```json\n", "```", "é", "😀",
                "\u2028", "\x00", "\t", "{", "}", "<", "`"]
FENCES = [("", ""), ("```json\n", "\n```"), ("```json", "```"), ("```JSON\n", "\n```"), ("```\n", "\n```"),
          ("```", "```"), ("  \n```json  \n", "   \n  ```  \n"), ("```python\n", "\n```"), ("``", "``")]

plain_text = st.text(st.characters(codec="utf-8", exclude_characters="<"), max_size=12)
noisy_text = st.lists(st.one_of(plain_text, st.sampled_from(TAG_NOISE)), max_size=6).map("".join)
answers = st.lists(st.one_of(plain_text, st.sampled_from(ANSWER_NOISE)), max_size=8).map("".join)

VALID_PARAMS: dict[str, list[dict[str, Any]]] = {
    "demo.search": [{"query": "paris weather"}],
    "demo.weather": [{"city": "Paris"}],
    "demo.render": [{"source": "q3", "format": "pdf"}, {"source": "q3", "format": "pptx"}],
    "demo.write_note": [{"text": "remember"}],
    "demo.clock": [{}],
    "demo.eval": [{}],
    "react.ask_user": [{"question": "Which city?", "options": ["Paris", "Rome"]}],
    "demo.nonexistent": [{}],
}
INVALID_PARAMS = [{"limit": "many"}, {"query": 3}, {"format": "docx"}, {"": None}]


def sometimes(draw: st.DrawFn, odds: int) -> bool:
    """True about once in `odds` draws: keeps most generated responses valid enough to stream."""
    return draw(st.integers(1, odds)) == 1


@st.composite
def call_tool_objects(draw: st.DrawFn) -> dict[str, Any]:
    tool_id = draw(st.sampled_from(sorted(VALID_PARAMS)))
    params = draw(st.sampled_from(INVALID_PARAMS if sometimes(draw, 4) else VALID_PARAMS[tool_id]))
    obj: dict[str, Any] = {"action": "call_tool", "tool_call": {"tool_id": tool_id, "params": params}}
    if sometimes(draw, 3):
        obj["final_answer"] = draw(answers)  # tolerated on call_tool, never shown
    return obj


@st.composite
def finish_objects(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {"action": draw(st.sampled_from(["complete", "exit"])), "final_answer": draw(answers)}
    if obj["action"] == "exit" and draw(st.booleans()):
        obj["reason"] = draw(answers)
    return obj


@st.composite
def action_blocks(draw: st.DrawFn) -> str:
    obj = draw(st.one_of(call_tool_objects(), finish_objects()))
    if sometimes(draw, 6):
        obj[draw(st.sampled_from(["confidence", "note", "tool_id"]))] = draw(st.sampled_from([1, "x", None]))
    keys = draw(st.permutations(list(obj)))
    body = json.dumps({k: obj[k] for k in keys}, ensure_ascii=draw(st.booleans()))
    if sometimes(draw, 8):
        body = body[: draw(st.integers(0, len(body)))]  # malformed: cut inside the JSON
    opener, closer = draw(st.sampled_from(FENCES if sometimes(draw, 4) else FENCES[:-2]))
    return f"<channel:action>{opener}{body}{closer}</channel:action>"


@st.composite
def responses(draw: st.DrawFn) -> str:
    parts = []
    preamble = draw(st.sampled_from(["  \n", "Sure! ", "<chan", "<channel:thinkin g>"])) if sometimes(draw, 8) else ""
    parts.append(preamble + f"<channel:thinking>{draw(noisy_text)}</channel:thinking>")
    for _ in range(draw(st.integers(1, 3))):
        parts.append(draw(st.sampled_from(["", "\n", " \t"])) + draw(action_blocks()))
    if sometimes(draw, 4):
        parts.append(f"<channel:code>{draw(st.sampled_from(['1 + 2', '(3 * 4) </channel:action> 5', '<x>']))}"
                     "</channel:code>")
    if sometimes(draw, 4):
        parts.append(f"<channel:summary>{draw(noisy_text)}</channel:summary>")
    if sometimes(draw, 12):
        parts.append(draw(st.sampled_from(["junk", "<channel:thinking>again</channel:thinking>", "<"])))
    text = "".join(parts)
    if sometimes(draw, 6):
        text = text[: draw(st.integers(0, len(text)))]  # truncated at a random point
    return text


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    if not text:
        return [""]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=min(len(text), 40))))
    if draw(st.booleans()):
        cuts = list(range(1, len(text)))  # one character per delta
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


round_rules = st.builds(
    lambda finish_legal, mode, max_actions, confirm: rules(
        finish_legal=finish_legal, finish_illegal_reason="no observation yet", mode=mode,
        max_actions=max_actions, confirmation_required=confirm,
    ),
    st.booleans(),
    st.sampled_from(["agent", "ask"]),
    st.sampled_from([2, 2, 1, 3]),
    st.integers(1, 8).map(lambda n: n == 1),
)

# -- playing them --------------------------------------------------------------------------------


@dataclass
class Played:
    events: list[RoundEvent]
    result: RoundResult

    def comparable(self) -> dict[str, Any]:
        """Everything a client or the model could observe."""
        r = self.result
        notices = [n.to_dict() for n in r.notices]
        return {
            "events": merged(self.events),
            "outcome": r.outcome,
            "streamed_state": r.streamed_state,
            "accepted": r.accepted,
            "denied": r.denied,
            "notices": notices,
            "calls": r.calls,
            "final": r.final,
            "thinking": r.thinking,
            "summary": r.summary,
        }


def play(deltas: list[str], round_rules: Any) -> Played:
    return Played(*roundkit.play(deltas, round_rules))


def decoded_answers(text: str) -> dict[int, str]:
    """Each action's decoded final_answer, as the channel parser reports it for the whole text."""
    parser = ChannelParser()
    answers: dict[int, str] = {}
    for event in [*parser.feed(text), *parser.finish()]:
        if isinstance(event, AnswerText):
            answers[event.index] = answers.get(event.index, "") + event.text
    return answers


# -- the properties ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(data=st.data(), text=responses(), round_rules=round_rules)
def test_delta_boundary_invariance(data: st.DataObject, text: str, round_rules: Any) -> None:
    whole = play([text], round_rules)
    first = play(data.draw(chunkings(text), label="first"), round_rules)
    second = play(data.draw(chunkings(text), label="second"), round_rules)
    assert first.comparable() == whole.comparable()
    assert second.comparable() == whole.comparable()


@PROPERTY_SETTINGS
@given(data=st.data(), text=responses(), round_rules=round_rules)
def test_preamble_preview_ends_at_the_first_impossible_character(
    data: st.DataObject, text: str, round_rules: Any
) -> None:
    played = play(data.draw(chunkings(text)), round_rules)
    for notice in played.result.notices:
        if notice.code is NoticeCode.PREAMBLE:
            preview = ast.literal_eval(notice.message.split("It began: ", 1)[1])  # quoted with repr()
            assert 0 < len(preview) <= PREVIEW_CHARS
            assert text.lstrip().startswith(preview)
            assert OPENING.startswith(preview[:-1]) and not OPENING.startswith(preview)


@PROPERTY_SETTINGS
@given(data=st.data(), text=responses(), round_rules=round_rules)
def test_denied_lane_emits_nothing(data: st.DataObject, text: str, round_rules: Any) -> None:
    played = play(data.draw(chunkings(text)), round_rules)
    lanes = played.result.streamed_state.lanes
    for lane in lanes:
        if lane.status == GateStatus.DENIED:
            assert lane.emitted_chars == 0
    shown = sum(len(e.text) for e in played.events if isinstance(e, AnswerDelta))
    assert shown == sum(lane.emitted_chars for lane in lanes if lane.status == GateStatus.ALLOWED)


@PROPERTY_SETTINGS
@given(data=st.data(), text=responses(), round_rules=round_rules)
def test_streamed_answer_is_prefix_of_decoded_final_answer(data: st.DataObject, text: str, round_rules: Any) -> None:
    played = play(data.draw(chunkings(text)), round_rules)
    shown = "".join(e.text for e in played.events if isinstance(e, AnswerDelta))
    answer_lanes = [lane for lane in played.result.streamed_state.lanes
                    if lane.lane == "answer" and lane.status == GateStatus.ALLOWED]
    assert len(answer_lanes) <= 1  # one answer lane at most: the rules deny any action after a final one
    if answer_lanes:
        assert decoded_answers(text).get(answer_lanes[0].index, "").startswith(shown)
    state = played.result.streamed_state
    assert state.answer_text == shown
    assert state.answer_streamed == bool(state.answer_text)
    if played.result.final is not None:
        assert played.result.final.final_answer == state.answer_text
