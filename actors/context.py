"""Context assembly: the prompt for the next decision, rendered from the timeline (docs/design.md#context).

Within the model's budget (LiteLLM's token counting) it never drops the system prompt, the turn's
user message or the latest observation (kept whole); it folds the oldest blocks into one summary
first, and that summary keeps the last tool JSON it folded verbatim. The system prompt teaches the
decision protocol with a worked example, lists the tools of the current state and mode with their
params schemas and traits, and states the rules the model will be held to.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from actors.catalog import ASK_USER_TOOL, ToolDecl, Trait
from actors.gates import CONTINUE_EXPLORING, EXPLORATION_MARKER, STOP_EXPLORING
from protocol.actions import call_tool_action
from protocol.channels import Channel, open_tag, render, render_action
from protocol.timeline import (
    Block,
    FinalBlock,
    NoticeBlock,
    SteerBlock,
    SummaryBlock,
    ThinkingBlock,
    ToolCallBlock,
    ToolResultBlock,
    UserMessageBlock,
)

Message = dict[str, Any]
TokenCounter = Callable[[Sequence[Mapping[str, Any]]], int]

LEDGER_MAX_CHARS: Final = 1500


# -- the step ledger ------------------------------------------------------------------------------


class Step(msgspec.Struct, frozen=True):
    tool_id: str
    params_digest: str
    ok: bool


def params_digest(params: Any) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def ledger_summary(steps: Sequence[Step], limit: int = LEDGER_MAX_CHARS) -> str:
    """The most recent steps that fit in `limit` characters, oldest first."""
    if not steps:
        return ""
    header = f"Steps so far ({len(steps)}):"
    reserve = len(f"\n(… {len(steps)} earlier steps)")  # room for the marker, so the total stays ≤ limit
    lines: list[str] = []
    used = len(header)
    for n, step in zip(range(len(steps), 0, -1), reversed(steps), strict=False):
        line = f"\n{n}. {step.tool_id} [{step.params_digest}] {'ok' if step.ok else 'error'}"
        if used + len(line) > limit - reserve:
            lines.append(f"\n(… {n} earlier steps)")
            break
        lines.append(line)
        used += len(line)
    return header + "".join(reversed(lines))


# -- the system prompt ----------------------------------------------------------------------------

# The protocol as the model is taught it; every tag is written by `protocol.channels` (one spelling).
_PROTOCOL: Final = """You are an agent governed by a runtime. Every response you write follows this protocol exactly.

Write channel blocks, separated only by whitespace, in this order:
1. {thinking_block} — first, exactly once.
2. One or more {action_tag} blocks (at most {{max_actions}}), each holding ONE JSON object, bare or in a ```json fence:
   - call a tool: {{{{"action": "call_tool", "tool_call": {{{{"tool_id": "<id>", "params": {{{{...}}}}}}}}}}}}
   - finish with an answer: {{{{"action": "complete", "final_answer": "<the answer for the user>"}}}}
   - stop when you cannot or should not go on: {{{{"action": "exit", "final_answer": "<why, for the user>", "reason": "<short>"}}}}
   - to ask the user, call the tool react.ask_user with {{{{"question": "...", "options": ["...", "..."]}}}}.
3. {code_block} — only for a tool marked uses_code; at most one.
4. {summary_block} — only with complete or exit; a short continuity summary.
Write nothing outside the blocks. Use only the keys shown.

Rules you are held to:
- Observe before you finish: answer with complete only after at least one tool observation in this turn{{finish_note}}.
- Never put complete or exit in the same response as a tool whose result you have not seen, except neutral tools.
- An exploitation tool (it uses data already visible) cannot share a response with an exploration tool (it fetches data).
- Exploration tools are budgeted ({{cap}} per turn). When a call returns EXPLORATION_BUDGET_REACHED, your next tool call
  must be react.ask_user with {{marker}} in the question and the options "{{cont}}" and "{{stop}}".
- Observations and runtime notices arrive as user messages starting with [observation] or [notice]. A notice says
  exactly what was rejected and why; correct that and continue.

{{example}}""".format(
    thinking_block=render(Channel.THINKING, "one or two short sentences of status for the user"),
    action_tag=open_tag(Channel.ACTION),
    code_block=render(Channel.CODE, "…"),
    summary_block=render(Channel.SUMMARY, "…"),
)


def _fenced(action: Mapping[str, Any]) -> str:
    return render(Channel.ACTION, f"```json\n{json.dumps(action, ensure_ascii=False)}\n```")


def _example(asks: str, first: str, call: str, then: str, second: str, answer: str) -> str:
    return (
        f"Worked example — the user asks {asks}:\n{render(Channel.THINKING, first)}\n{call}\n"
        f"Then, after the observation{then}:\n{render(Channel.THINKING, second)}\n"
        f"{render_action({'action': 'complete', 'final_answer': answer})}\n"
    )


# The demo agent's worked example (docs/design.md#demo-tools); any other agent gets one built from
# its own tools, so no agent's prompt mentions a tool it does not have.
_DEMO_EXAMPLE_TOOL: Final = "demo.weather"
_DEMO_EXAMPLE: Final = _example(
    '"What\'s the weather in Paris?"', "Checking the weather in Paris.",
    _fenced({"action": "call_tool", "tool_call": {"tool_id": _DEMO_EXAMPLE_TOOL, "params": {"city": "Paris"}}}),
    ' {"city": "Paris", "condition": "rain", "temp_c": 12}', "Paris is rainy right now.", "It is raining in Paris, 12 °C.",
)
_EXAMPLE_WITHOUT_TOOLS: Final = (
    "Worked example — the user asks a question you can answer:\n"
    f"{render(Channel.THINKING, 'Answering directly.')}\n"
    f"{render_action({'action': 'complete', 'final_answer': '<the answer>'})}\n"
)

_PLACEHOLDERS: Final = {"string": "…", "integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}


def worked_example(tools: Sequence[ToolDecl]) -> str:
    """The protocol's worked example, from the agent's own tools: the demo's for the demo agent, a
    call of its first tool (an exploration tool if it has one) otherwise, a direct answer if none."""
    callable_tools = [d for d in tools if d.tool_id != ASK_USER_TOOL]
    if any(d.tool_id == _DEMO_EXAMPLE_TOOL for d in callable_tools):
        return _DEMO_EXAMPLE
    if not callable_tools:
        return _EXAMPLE_WITHOUT_TOOLS
    decl = next((d for d in callable_tools if d.trait == Trait.EXPLORATION), callable_tools[0])
    properties = decl.params_schema.get("properties", {})
    params = {name: _PLACEHOLDERS.get(str(properties.get(name, {}).get("type")), "…")
              for name in decl.params_schema.get("required", [])}
    call = {"action": "call_tool", "tool_call": {"tool_id": decl.tool_id, "params": params}}
    return _example(f"something your tool {decl.tool_id} can look up", "Looking that up.", _fenced(call), "",
                    "I have what I need.", "<the answer, from the observation>")


def system_prompt(
    *,
    agent: str,
    state: str,
    mode: str,
    tools: Sequence[ToolDecl],
    max_actions: int,
    exploration_cap: int,
    allow_no_tool: bool,
    ledger: str,
    instructions: str | None = None,
) -> str:
    """The system prompt: the agent's own instructions first, then the protocol with a worked
    example built from the tools available now, then those tools — the same declarations the gates
    decide from, so the prompt and the gates never disagree."""
    finish_note = " (this agent may also answer without a tool when no tool is needed)" if allow_no_tool else ""
    parts = [instructions.strip() + "\n"] if instructions and instructions.strip() else []
    parts += [
        _PROTOCOL.format(
            max_actions=max_actions, cap=exploration_cap, marker=EXPLORATION_MARKER,
            cont=CONTINUE_EXPLORING, stop=STOP_EXPLORING, finish_note=finish_note,
            example=worked_example(tools),
        ),
        f"Agent: {agent}. Current state: {state}. Mode: {mode}"
        + (" (read-only: tools that write are not available)." if mode == "ask" else "."),
        "Tools available now:",
    ]
    for decl in tools:
        flags = [f"trait={decl.trait}", f"safety={decl.safety}"]
        if decl.uses_code:
            flags.append("uses_code")
        if decl.transitions_state:
            flags.append("changes state")
        schema = json.dumps(compact_schema(decl.params_schema), ensure_ascii=False)
        parts.append(f"- {decl.tool_id} ({', '.join(flags)}): {decl.description}\n  params: {schema}")
    if ledger:
        parts.append(ledger)
    return "\n".join(parts)


def compact_schema(schema: Any) -> Any:
    """The params schema without pydantic's titles: fewer tokens, same meaning."""
    if isinstance(schema, dict):
        return {k: compact_schema(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [compact_schema(v) for v in schema]
    return schema


# -- rendering the timeline -----------------------------------------------------------------------


@dataclass(slots=True)
class Unit:
    """Messages that are kept or folded together: one, or a native call and its answers
    (docs/design.md#native: a call is never sent without its answer)."""

    messages: list[Message]
    required: bool
    tool_json: str | None = None   # the observation JSON this unit carries, if any

    @property
    def role(self) -> str:
        return str(self.messages[0]["role"])


Render = Callable[[Sequence[Block], str], list[Unit]]


def _unit(message: Message, required: bool = False, tool_json: str | None = None) -> Unit:
    return Unit([message], required, tool_json)


def render_timeline(blocks: Sequence[Block], turn_id: str) -> list[Unit]:
    """The timeline in the channel protocol's terms (docs/design.md#timeline)."""
    units: list[Unit] = []
    assistant: list[str] = []
    latest_result = max(
        (i for i, b in enumerate(blocks) if isinstance(b, ToolResultBlock)), default=-1
    )

    def flush_assistant() -> None:
        if assistant:
            units.append(_unit({"role": "assistant", "content": "\n".join(assistant)}))
            assistant.clear()

    for i, block in enumerate(blocks):
        if isinstance(block, ThinkingBlock):
            flush_assistant()
            assistant.append(render(Channel.THINKING, block.text))
        elif isinstance(block, ToolCallBlock):
            assistant.append(render_action(call_tool_action(block.tool_id, block.params)))
            if block.code is not None:
                assistant.append(render(Channel.CODE, block.code))
        elif isinstance(block, FinalBlock):
            assistant.append(render_action({"action": "complete", "final_answer": block.text}))
        elif isinstance(block, SummaryBlock):
            assistant.append(render(Channel.SUMMARY, block.text))
        else:
            flush_assistant()
            if isinstance(block, UserMessageBlock):
                units.append(_unit({"role": "user", "content": block.text}, required=block.turn_id == turn_id))
            elif isinstance(block, ToolResultBlock):
                payload = json.dumps(block.payload, ensure_ascii=False)
                units.append(
                    _unit(
                        {"role": "user", "content": f"[observation] {block.tool_id} ({block.call_id}): {payload}"},
                        required=i == latest_result, tool_json=payload,
                    )
                )
            elif isinstance(block, NoticeBlock):
                units.append(_unit({"role": "user", "content": notice_text(block.notice)}))
            elif isinstance(block, SteerBlock):
                units.append(_unit({"role": "user", "content": steer_text(block, "answer with complete or exit only")},
                                   required=block.turn_id == turn_id))
    flush_assistant()
    return units


def notice_text(notice: Mapping[str, Any]) -> str:
    return f"[notice] {json.dumps(notice, ensure_ascii=False)}"


def steer_text(block: SteerBlock, finish: str) -> str:
    """A steer as the model reads it: the user's words, what it cut, and how to finish now."""
    return (f"[steer] The user interrupted you: {block.text}\n"
            f"Your interrupted output was:\n{block.interrupted_raw}\n"
            f"Finish now: {finish}.")


# A message's key for a kept count: its JSON (a native one holds lists and objects, its `tool_calls`).
message_key: Final = msgspec.json.Encoder().encode


class PromptCounts:
    """One conversation's message token counts, each kept from one prompt to the next. Every prompt
    counts its whole history again (`assemble`), and a history is the last prompt's plus a few
    messages, so each prompt counts only what is new. Only what the last prompt counted is kept:
    the memory is one prompt's, and no number of conversations in a process makes a history miss
    (one cache shared by all of them did once it held fewer messages than they had between two
    prompts of one conversation)."""

    __slots__ = ("_count", "_last", "_now")

    def __init__(self, count: TokenCounter) -> None:
        self._count = count
        self._last: dict[bytes, int] = {}
        self._now: dict[bytes, int] = {}

    def next_prompt(self) -> TokenCounter:
        """The counter of the next prompt: it keeps what the last prompt counted, and drops the rest."""
        self._last, self._now = self._now, {}
        return self

    def __call__(self, messages: Sequence[Mapping[str, Any]]) -> int:
        if len(messages) != 1:
            return self._count(messages)
        key = message_key(messages[0])
        n = self._now.get(key)
        if n is None:
            n = self._last.get(key)
            if n is None:
                n = self._count(messages)
            self._now[key] = n
        return n


def assemble(
    system: str,
    blocks: Sequence[Block],
    *,
    turn_id: str,
    budget_tokens: int,
    count_tokens: TokenCounter,
    render: Render = render_timeline,
) -> list[Message]:
    """The messages for the next decision, within `budget_tokens` where that is possible at all.
    `render`: the timeline in the decision protocol's terms (channels, or native)."""
    units = render(blocks, turn_id)
    head: Message = {"role": "system", "content": system}
    sizes = [sum(count_tokens([m]) for m in u.messages) for u in units]
    total = count_tokens([head]) + sum(sizes)
    if total <= budget_tokens:
        return [head, *(m for u in units for m in u.messages)]
    folded: list[Unit] = []
    kept = list(range(len(units)))
    for i in range(len(units)):  # oldest first
        if units[i].required:
            continue
        kept.remove(i)
        folded.append(units[i])
        summary = _summary(folded)
        if count_tokens([head]) + count_tokens([summary]) + sum(sizes[k] for k in kept) <= budget_tokens:
            break
    summary = _summary(folded)
    return [head, summary, *(m for k in kept for m in units[k].messages)]


def _summary(folded: Sequence[Unit]) -> Message:
    users = sum(1 for u in folded if u.role == "user" and u.tool_json is None)
    observations = [u for u in folded if u.tool_json is not None]
    text = (
        f"[summary] {len(folded)} earlier messages were folded to fit the context: "
        f"{users} user or notice messages, {len(observations)} observations."
    )
    if observations:
        text += f" The last folded observation, verbatim: {observations[-1].tool_json}"
    return {"role": "user", "content": text}
