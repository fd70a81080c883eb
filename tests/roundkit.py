"""Helpers to drive a RoundEngine from plain strings, with the demo tools' declarations, and to
write scripted-model rounds (docs/design.md#scripted-model) as what the model says."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import msgspec

from actors.gates import RoundRules
from actors.round import RoundEngine, RoundEvent, RoundResult, ToolCallReady
from actors.tools.demo import demo_registry
from protocol.events import AnswerDelta, ThinkingDelta

REGISTRY = demo_registry()
CATALOG = REGISTRY.catalog()


def validate_params(tool_id: str, params: Mapping[str, Any]) -> list[str]:
    return REGISTRY.validate_params(tool_id, params)[1]


def rules(**overrides: Any) -> RoundRules:
    base = RoundRules(catalog=CATALOG, state="focused", validate_params=validate_params)
    return replace(base, **overrides)


def thinking(text: str = "Working on it.") -> str:
    return f"<channel:thinking>{text}</channel:thinking>"


def action(obj: Mapping[str, Any] | str, opener: str = "```json\n", closer: str = "\n```") -> str:
    body = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"<channel:action>{opener}{body}{closer}</channel:action>"


def call(tool_id: str, **params: Any) -> dict[str, Any]:
    return {"action": "call_tool", "tool_call": {"tool_id": tool_id, "params": params}}


def complete(answer: str) -> dict[str, Any]:
    return {"action": "complete", "final_answer": answer}


def text_round(*parts: str, **round_fields: Any) -> dict[str, Any]:
    """A scripted-model round (docs/design.md#scripted-model) streaming the concatenated parts (`chunk_chars`, `delay_ms`, …)."""
    return {"text": "".join(parts), **round_fields}


def chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def play(deltas: Iterable[str] | str, round_rules: RoundRules | None = None) -> tuple[list[RoundEvent], RoundResult]:
    if isinstance(deltas, str):
        deltas = [deltas]
    engine = RoundEngine(round_rules or rules(), turn_id="t1", round_no=1)
    events: list[RoundEvent] = []
    for delta in deltas:
        events += engine.feed(delta)
        if engine.aborted:
            break
    tail, result = engine.finish()
    return events + tail, result


def merged(events: list[RoundEvent]) -> list[RoundEvent]:
    """Adjacent deltas of one lane merged: what re-chunking may legitimately change."""
    out: list[RoundEvent] = []
    for e in events:
        prev = out[-1] if out else None
        if isinstance(e, ThinkingDelta | AnswerDelta) and type(prev) is type(e):
            out[-1] = msgspec.structs.replace(e, text=prev.text + e.text)  # type: ignore[union-attr]
        else:
            out.append(e)
    return out


def answer_text(events: list[RoundEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, AnswerDelta))


def tool_calls(events: list[RoundEvent]) -> list[ToolCallReady]:
    return [e for e in events if isinstance(e, ToolCallReady)]


def codes(result: RoundResult) -> list[str]:
    return [str(n.code) for n in result.notices]
