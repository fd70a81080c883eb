"""The requests `reactgate mock-llm` refuses with the provider's own 400, as the real ones do
(docs/design.md#scripted-model): a request body in, the first rule it breaks out — no I/O.

A test that plays native rounds through the mock sees the histories reactgate sends judged by the
rules a real provider applies to a native history (docs/design.md#native), and asserts that none
fired (`MockStats.refused`). The rules are tables, read in order, one per wire; each
names what it refuses, which is what the stats count.

The thinking rule needs to know what the mock itself streamed: `Issued` holds the signatures in the
script (a thinking block whose signature the mock never issued, or whose text is not the text it
signed, is refused as Anthropic refuses it), and the thinking blocks of each round that made calls
after signed thinking — an assistant message with those calls must carry those blocks unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from actors.llm.scripts import Script

NAME_PATTERN: Final = "^[a-zA-Z0-9_-]{1,64}$"
_NAME: Final = re.compile(NAME_PATTERN)


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a rule found: the provider's message, (OpenAI) the parameter and code it names, and the
    rule, filled in by `first_refusal` from its table."""

    message: str
    param: str | None = None
    code: str | None = None
    rule: str = ""


Fingerprint = tuple[tuple[str, str], ...]   # a message's calls: (name, its arguments as canonical JSON)
Block = tuple[tuple[str, Any], ...]           # a thinking block, comparable


@dataclass(frozen=True)
class Issued:
    """What the mock streams that a request must send back unchanged (the module's docstring)."""

    signatures: Mapping[str, str] = field(default_factory=dict)     # signature → the thinking it signs
    redacted: frozenset[str] = frozenset()
    with_calls: Mapping[Fingerprint, frozenset[tuple[Block, ...]]] = field(default_factory=dict)

    @classmethod
    def of(cls, script: Script) -> Issued:
        signatures: dict[str, str] = {}
        redacted: set[str] = set()
        with_calls: dict[Fingerprint, set[tuple[Block, ...]]] = {}
        for round_ in script.all_rounds():
            blocks = round_.thinking_blocks()
            for b in blocks:
                if b["type"] == "thinking":
                    signatures[b["signature"]] = b["thinking"]
                else:
                    redacted.add(b["data"])
            calls = [(c.name, _parsed(c.arguments)) for c in round_.calls]
            if calls and any(b["type"] == "thinking" for b in blocks) and all(isinstance(a, dict) for _, a in calls):
                fingerprint = tuple((name, _canonical(args)) for name, args in calls)
                with_calls.setdefault(fingerprint, set()).add(tuple(_comparable(b) for b in blocks))
        return cls(signatures, frozenset(redacted), {k: frozenset(v) for k, v in with_calls.items()})


Check = Callable[[Mapping[str, Any], Issued], Refusal | None]


def first_refusal(checks: Sequence[tuple[str, Check]], body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    """The first rule of `checks` the request breaks, or None."""
    for rule, check in checks:
        found = check(body, issued)
        if found is not None:
            return replace(found, rule=rule)
    return None


# -- helpers ---------------------------------------------------------------------------------------


def _list(value: Any) -> list[Any]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return _list(body.get("messages"))


def _parsed(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _comparable(block: Mapping[str, Any]) -> Block:
    keys = ("type", "thinking", "signature") if block.get("type") == "thinking" else ("type", "data")
    return tuple((k, block.get(k)) for k in keys)


def _name_refused(name: Any, where: str) -> Refusal | None:
    if isinstance(name, str) and _NAME.match(name):
        return None
    if isinstance(name, str) and len(name) > 64:
        return Refusal(f"Invalid '{where}': string too long. Expected a string with maximum length 64, "
                       f"but got a string with length {len(name)} instead.", where, "string_above_max_length")
    return Refusal(f"Invalid '{where}': string does not match pattern. Expected a string that matches the "
                   f"pattern '{NAME_PATTERN}'.", where, "invalid_value")


# -- OpenAI chat completions -------------------------------------------------------------------------


def _openai_tool_names(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    for i, tool in enumerate(_list(body.get("tools"))):
        function = tool.get("function") if isinstance(tool.get("function"), Mapping) else {}
        if (found := _name_refused(function.get("name"), f"tools[{i}].function.name")) is not None:
            return found
    return None


def _openai_history_names(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    for i, message in enumerate(_messages(body)):
        for j, call in enumerate(_list(message.get("tool_calls"))):
            function = call.get("function") if isinstance(call.get("function"), Mapping) else {}
            where = f"messages[{i}].tool_calls[{j}].function.name"
            if (found := _name_refused(function.get("name"), where)) is not None:
                return found
    return None


def _tool_runs(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, list[str], list[tuple[int, Any]]]]:
    """Each assistant message with `tool_calls`: its index, its call ids, and the `tool` messages
    right after it (index, tool_call_id)."""
    for i, message in enumerate(messages):
        calls = _list(message.get("tool_calls")) if message.get("role") == "assistant" else []
        if calls:
            answers = []
            for j in range(i + 1, len(messages)):
                if messages[j].get("role") != "tool":
                    break
                answers.append((j, messages[j].get("tool_call_id")))
            yield i, [str(c.get("id")) for c in calls], answers


def _openai_unanswered(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    messages = _messages(body)
    for i, ids, answers in _tool_runs(messages):
        missing = [c for c in ids if c not in {a for _, a in answers}]
        if missing:
            return Refusal("An assistant message with 'tool_calls' must be followed by tool messages responding "
                           "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                           + ", ".join(missing), f"messages.[{i + 1 + len(answers)}].role")
    return None


def _openai_unasked(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    messages = _messages(body)
    asked = {j: ids for _, ids, answers in _tool_runs(messages) for j, _ in answers}
    for j, message in enumerate(messages):
        if message.get("role") == "tool" and message.get("tool_call_id") not in asked.get(j, ()):
            return Refusal("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                           "message with 'tool_calls'.", f"messages.[{j}].role")
    return None


# In OpenAI's order: the request's schema (names), then the conversation.
OPENAI_CHECKS: Final[Sequence[tuple[str, Check]]] = (
    ("function_name", _openai_tool_names),
    ("function_name", _openai_history_names),
    ("tool_calls_unanswered", _openai_unanswered),
    ("tool_message_unasked", _openai_unasked),
)


# -- Anthropic Messages ------------------------------------------------------------------------------


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return _list(content)


def _of_type(message: Mapping[str, Any], kind: str) -> list[tuple[int, Mapping[str, Any]]]:
    return [(j, b) for j, b in enumerate(_blocks(message)) if b.get("type") == kind]


def _anthropic_roles(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    messages = _messages(body)
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ("user", "assistant"):
            return Refusal(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if i == 0 and role != "user":
            return Refusal('messages: first message must use the "user" role')
        if i and messages[i - 1].get("role") == role:
            return Refusal(f'messages: roles must alternate between "user" and "assistant", but found multiple '
                           f'"{role}" roles in a row')
    return None


def _anthropic_tool_names(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    for i, tool in enumerate(_list(body.get("tools"))):
        name = tool.get("name")
        if not (isinstance(name, str) and _NAME.match(name)):
            return Refusal(f"tools.{i}.custom.name: String should match pattern '{NAME_PATTERN}'")
    return None


def _anthropic_tools_missing(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    if body.get("tools"):
        return None
    if any(_of_type(m, "tool_use") or _of_type(m, "tool_result") for m in _messages(body)):
        return Refusal("Requests which include `tool_use` or `tool_result` blocks must define tools.")
    return None


def _anthropic_unanswered(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    messages = _messages(body)
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        asked = [str(b.get("id")) for _, b in _of_type(message, "tool_use")]
        following = messages[i + 1] if i + 1 < len(messages) and messages[i + 1].get("role") == "user" else {}
        answered = {str(b.get("tool_use_id")) for _, b in _of_type(following, "tool_result")}
        missing = [a for a in asked if a not in answered]
        if missing:
            return Refusal(f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                           f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                           "`tool_result` block in the next message.")
    return None


def _anthropic_unasked(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    messages = _messages(body)
    for i, message in enumerate(messages):
        before = messages[i - 1] if i and messages[i - 1].get("role") == "assistant" else {}
        asked = {str(b.get("id")) for _, b in _of_type(before, "tool_use")}
        for j, block in _of_type(message, "tool_result"):
            if str(block.get("tool_use_id")) not in asked:
                return Refusal(f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                               f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                               "`tool_use` block in the previous message.")
    return None


_THINKING_FIRST: Final = (
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the "
    "lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from previous "
    "turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def _anthropic_thinking(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    for i, message in enumerate(_messages(body)):
        if message.get("role") != "assistant":
            continue
        blocks = _blocks(message)
        thinking = [(j, b) for j, b in enumerate(blocks) if b.get("type") in ("thinking", "redacted_thinking")]
        for j, b in thinking:
            if b.get("type") == "thinking" and issued.signatures.get(str(b.get("signature"))) != b.get("thinking"):
                return Refusal(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
            if b.get("type") == "redacted_thinking" and b.get("data") not in issued.redacted:
                return Refusal(f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block")
        calls = [(b.get("name"), b.get("input")) for _, b in _of_type(message, "tool_use")]
        streamed = issued.with_calls.get(tuple((str(n), _canonical(a)) for n, a in calls)) if calls else None
        if streamed and tuple(_comparable(b) for _, b in thinking) not in streamed:
            if not thinking:
                first = blocks[0].get("type") if blocks else "nothing"
                return Refusal(f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                               f"`{first}`. {_THINKING_FIRST}")
            return Refusal(f"messages.{i}.content: the thinking blocks of an assistant message that used tools must "
                           "be sent back as they came, in order, none left out")
    return None


def _anthropic_prefill(body: Mapping[str, Any], issued: Issued) -> Refusal | None:
    messages = _messages(body)
    last = messages[-1] if messages else None
    if last is None or last.get("role") != "assistant":
        return None
    blocks = _blocks(last)
    text = blocks[-1].get("text") if blocks and blocks[-1].get("type") == "text" else None
    if isinstance(text, str) and text != text.rstrip():
        return Refusal("messages: final assistant content cannot end with trailing whitespace")
    return None


# In Anthropic's order: the shape of the conversation, the tools, then what the blocks hold.
ANTHROPIC_CHECKS: Final[Sequence[tuple[str, Check]]] = (
    ("roles", _anthropic_roles),
    ("function_name", _anthropic_tool_names),
    ("tools_missing", _anthropic_tools_missing),
    ("tool_use_unanswered", _anthropic_unanswered),
    ("tool_result_unasked", _anthropic_unasked),
    ("thinking_blocks", _anthropic_thinking),
    ("prefill_whitespace", _anthropic_prefill),
)
