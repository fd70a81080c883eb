"""The native decision protocol's request side (docs/design.md#native): the functions a round
offers, the system prompt that teaches no protocol and lists no tool, the history in the
provider's own shape, a cut answer asked to go on, and a native round's recording.

The stream side is `protocol/native.py`; both protocols then share one round engine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from actors.catalog import ToolDecl
from actors.context import Message, Unit, compact_schema, notice_text, steer_text
from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, STOP_EXPLORING
from protocol.deltas import (
    ModelDelta,
    ModelOutput,
    ReasoningDelta,
    ReasoningSignature,
    RedactedReasoning,
    ToolCallArgs,
    ToolCallEnd,
    ToolCallStart,
    decode_deltas,
    encode_deltas,
)
from protocol.native import CODE_ARGUMENT, function_name
from protocol.timeline import (
    Block,
    FinalBlock,
    ModelMessageBlock,
    NativeCall,
    NoticeBlock,
    SteerBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessageBlock,
)

# -- the functions ----------------------------------------------------------------------------------


def function_names(decls: Iterable[ToolDecl]) -> dict[str, str]:
    """Function name → tool id, for the decoder (collisions are refused with the profile)."""
    return {function_name(d.tool_id): d.tool_id for d in decls}


def functions(decls: Sequence[ToolDecl]) -> list[dict[str, Any]]:
    """The request's `tools`: one function per tool available now, described as the gates see it."""
    return [_function(d) for d in decls]


def _function(decl: ToolDecl) -> dict[str, Any]:
    schema = dict(compact_schema(decl.params_schema)) or {}
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    if decl.uses_code:  # the code channel, natively: one more argument (protocol/native.py)
        schema["properties"] = {**schema["properties"], CODE_ARGUMENT: {"type": "string",
                                                                        "description": "the code this tool reads"}}
        schema["required"] = [*schema.get("required", []), CODE_ARGUMENT]
    description = (decl.description or decl.tool_id).strip()
    flags = f"trait: {decl.trait}, safety: {decl.safety}" + (", changes state" if decl.transitions_state else "")
    return {"type": "function", "function": {
        "name": function_name(decl.tool_id), "description": f"{description} ({flags})", "parameters": schema,
    }}


# -- the system prompt ------------------------------------------------------------------------------

_RULES: Final = """You are an agent governed by a runtime: it checks every function call before it runs and every answer before it is shown.
Rules you are held to:
- Observe before you finish: answer only after at least one function result in this turn{finish_note}.
- Do not answer in the same message as a call whose result you have not seen, except neutral functions.
- An exploitation function (it uses data already visible) cannot be called in the same message as an exploration function (it fetches data). Each function's description says its trait.
- At most {max_actions} function calls per message.
- Exploration functions are budgeted ({cap} per turn). When a call returns EXPLORATION_BUDGET_REACHED, your next call
  must be {ask} with {marker} in the question and the options "{cont}" and "{stop}".
- To ask the user something, call {ask}.
- A refused call is answered with a notice that says exactly what was refused and why; other runtime notices arrive
  as user messages starting with [notice]. Correct that and continue."""


def system_prompt(
    *, agent: str, state: str, mode: str, max_actions: int, exploration_cap: int, allow_no_tool: bool,
    ledger: str, instructions: str | None = None,
) -> str:
    """The agent's instructions, then the rules; the tools travel as the request's functions."""
    finish_note = " (this agent may also answer without a function when none is needed)" if allow_no_tool else ""
    parts = [instructions.strip() + "\n"] if instructions and instructions.strip() else []
    parts += [
        _RULES.format(finish_note=finish_note, max_actions=max_actions, cap=exploration_cap,
                      ask=function_name("react.ask_user"), marker=EXPLORATION_MARKER, cont=CONTINUE_EXPLORING,
                      stop=STOP_EXPLORING),
        f"Agent: {agent}. Current state: {state}. Mode: {mode}"
        + (" (read-only: functions that write are not available)." if mode == "ask" else "."),
    ]
    if ledger:
        parts.append(ledger)
    return "\n".join(parts)


# -- the history ---------------------------------------------------------------------------------------

NOT_RUN: Final = {"error": "not_run", "message": "this call was not run"}


def history_id(call_id: str) -> str:
    """A call's id in the history: ours (turn.round.index), in the characters providers accept."""
    return call_id.replace(".", "_")


def render_history(blocks: Sequence[Block], turn_id: str) -> list[Unit]:
    """The timeline in the provider's own shape (docs/design.md#native): each round an assistant
    message with its `tool_calls`, then one `tool` message per call — its observation, or the notice
    that refused it. Every call is answered; a notice that belongs to no call is a user message."""
    results = {b.call_id: b for b in blocks if isinstance(b, ToolResultBlock)}
    latest = next((b.call_id for b in reversed(blocks) if isinstance(b, ToolResultBlock)), None)
    messages = {(b.turn_id, b.round) for b in blocks if isinstance(b, ModelMessageBlock)}
    notices: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for b in blocks:
        if isinstance(b, NoticeBlock):
            notices.setdefault((b.turn_id, b.round), []).append(b.notice)
    units: list[Unit] = []
    cut_calls: list[ToolCallBlock] = []   # calls of a round no message records (a crash cut it)

    def flush_cut() -> None:
        if cut_calls:
            calls = [NativeCall(int(c.call_id.rsplit(".", 1)[1]), c.tool_id, dict(c.params)) for c in cut_calls]
            _add(units, _call_unit(cut_calls[0].turn_id, cut_calls[0].round, "", calls, [], results, {}, latest))
            cut_calls.clear()

    for block in blocks:
        if isinstance(block, ToolCallBlock) and (block.turn_id, block.round) not in messages:
            cut_calls.append(block)
            continue
        flush_cut()
        if isinstance(block, ModelMessageBlock):
            by_index = {n.get("index"): n for n in notices.get((block.turn_id, block.round), ())}
            _add(units, _call_unit(block.turn_id, block.round, block.content, block.calls, block.reasoning,
                                   results, by_index, latest))
            called = {c.index for c in block.calls}
            units += [Unit([{"role": "user", "content": notice_text(n)}], False)
                      for n in notices.get((block.turn_id, block.round), ()) if n.get("index") not in called]
        elif isinstance(block, NoticeBlock) and (block.turn_id, block.round) not in messages:
            units.append(Unit([{"role": "user", "content": notice_text(block.notice)}], False))
        elif isinstance(block, UserMessageBlock):
            units.append(Unit([{"role": "user", "content": block.text}], block.turn_id == turn_id))
        elif isinstance(block, SteerBlock):
            units.append(Unit([{"role": "user", "content": steer_text(block, "answer, without calling a function")}],
                              block.turn_id == turn_id))
        elif isinstance(block, FinalBlock):
            units.append(Unit([{"role": "assistant", "content": block.text}], False))
        # Thinking, results and the rest are rendered with their round's message, or not at all.
    flush_cut()
    return units


def _add(units: list[Unit], unit: Unit | None) -> None:
    if unit is not None:
        units.append(unit)


def _call_unit(
    turn_id: str, round_no: int, content: str, calls: Sequence[NativeCall], reasoning: Sequence[Mapping[str, Any]],
    results: Mapping[str, ToolResultBlock], notices: Mapping[Any, Mapping[str, Any]], latest: str | None,
) -> Unit | None:
    """A round's assistant message and the answer to each of its calls, kept and folded together."""
    if not content and not calls:
        return None  # nothing the model said is sent back (an illegal finish, say): its notice says it
    assistant: Message = {"role": "assistant", "content": content or None}
    if reasoning:
        assistant["thinking_blocks"] = [dict(b) for b in reasoning]
    answers: list[Message] = []
    tool_json = None
    if calls:
        assistant["tool_calls"] = []
        for call in calls:
            call_id = f"{turn_id}.{round_no}.{call.index}"
            arguments = json.dumps(call.params if call.params is not None else {}, ensure_ascii=False)
            assistant["tool_calls"].append({"id": history_id(call_id), "type": "function",
                                            "function": {"name": function_name(call.tool_id), "arguments": arguments}})
            result = results.get(call_id)
            if result is not None:
                answer = json.dumps(result.payload, ensure_ascii=False)
                tool_json = answer if call_id == latest else tool_json
            else:
                answer = json.dumps(notices.get(call.index, NOT_RUN), ensure_ascii=False)
            answers.append({"role": "tool", "tool_call_id": history_id(call_id), "content": answer})
    return Unit([assistant, *answers], tool_json is not None, tool_json)


# -- continuation --------------------------------------------------------------------------------------


def continue_messages(base: list[Message], answer: str, prompt: str, *, prefill: bool) -> list[Message]:
    """A cut answer asked to go on (docs/design.md#native): an assistant prefill where the provider
    takes one (it may not end in whitespace), else the answer so far and the `[continue]` ask."""
    if prefill:
        return [*base, {"role": "assistant", "content": answer.rstrip()}]
    return [*base, {"role": "assistant", "content": answer}, {"role": "user", "content": prompt}]


def rebuilt_deltas(thinking: str, announced: Iterable[Any], answer: str) -> list[ModelOutput]:
    """A round a crash cut mid-answer, as deltas the durable events tell: its reasoning, the calls it
    announced, and the answer so far (docs/design.md#recovery)."""
    out: list[ModelOutput] = [ReasoningDelta(thinking)] if thinking else []
    for n, call in enumerate(announced):
        out += [ToolCallStart(n, call.call_id, function_name(call.tool_id)),
                ToolCallArgs(n, json.dumps(call.params, ensure_ascii=False)), ToolCallEnd(n)]
    if answer:
        out.append(ModelDelta(answer))
    return out


# -- what a native round leaves -------------------------------------------------------------------------


def thinking_blocks(deltas: Iterable[ModelOutput]) -> list[dict[str, Any]]:
    """The provider's signed thinking blocks, as they came: sent back unchanged in the turn's later
    requests (Anthropic refuses a tool-use history without them), never shown."""
    blocks: list[dict[str, Any]] = []
    text: list[str] = []
    for d in deltas:
        if type(d) is ReasoningDelta:
            text.append(d.text)
        elif type(d) is ReasoningSignature:
            blocks.append({"type": "thinking", "thinking": "".join(text), "signature": d.signature})
            text.clear()
        elif type(d) is RedactedReasoning:
            blocks.append({"type": "redacted_thinking", "data": d.data})
    return blocks


# A native round's raw output, in the store's `raw` column: its deltas behind this mark, which no
# channel response can start with (docs/design.md#replay).
NATIVE_MARK: Final = "\x00native\x00"


def recorded(deltas: Sequence[ModelOutput]) -> str:
    return NATIVE_MARK + encode_deltas(deltas).decode()


def is_native(raw: str) -> bool:
    return raw.startswith(NATIVE_MARK)


def replayed(raw: str) -> list[ModelOutput]:
    return decode_deltas(raw[len(NATIVE_MARK):])
