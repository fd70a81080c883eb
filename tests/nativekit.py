"""A native model for turn tests (docs/design.md#native): each call plays its round of typed
deltas, and every request it receives is checked as a provider would check it.

`NativeModel(rounds)` is a `stream_model` stand-in for `tests.convkit.harness(stream=…)`: call i
plays `rounds[i]` (deltas, then a finish reason, or a `ProviderError` after them), recording the
messages and the `tools` it was sent. `check_request` refuses what OpenAI and Anthropic refuse: a
call in the history not answered by a tool message with its id, an answer to no call, a function
name providers reject, a prefill ending in whitespace.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.llm.deltas import ModelFinished
from actors.llm.errors import ProviderError
from protocol.deltas import ModelDelta, ModelOutput, ReasoningDelta, ToolCallArgs, ToolCallEnd, ToolCallStart

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass
class NativeRound:
    deltas: list[ModelOutput]
    finish: str = "stop"
    error: str | None = None      # a ProviderError kind raised after the deltas


@dataclass
class Request:
    models: tuple[str, ...]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]

    @property
    def functions(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    @property
    def system(self) -> str:
        return str(self.messages[0]["content"])


@dataclass
class NativeModel:
    rounds: list[NativeRound]
    requests: list[Request] = field(default_factory=list)

    def __call__(self, models: Sequence[str], messages: list[dict[str, Any]], **kwargs: Any) -> AsyncIterator[Any]:
        index = kwargs["next_call_index"]()
        request = Request(tuple(models), json.loads(json.dumps(messages)), list(kwargs.get("tools") or []))
        check_request(request)
        self.requests.append(request)
        return self._play(self.rounds[index], models[0])

    async def _play(self, round_: NativeRound, model: str) -> AsyncIterator[Any]:
        for d in round_.deltas:
            yield d
        if round_.error is not None:
            raise ProviderError(round_.error, model, "scripted failure", after_first_delta=bool(round_.deltas))
        yield ModelFinished(round_.finish, model)


def check_request(request: Request) -> None:
    """What a provider would refuse with a 400 (FIELD_NOTES: native function calling on the wire)."""
    for name in request.functions:
        assert NAME.match(name), f"function name {name!r}"
    owed: list[str] = []
    for i, m in enumerate(request.messages):
        if m["role"] == "tool":
            assert m["tool_call_id"] in owed, f"message {i} answers no call: {m}"
            owed.remove(m["tool_call_id"])
            continue
        assert not owed, f"calls {owed} not answered before message {i}: {m}"
        for call in m.get("tool_calls") or ():
            assert NAME.match(call["function"]["name"]), call
            json.loads(call["function"]["arguments"])
            owed.append(call["id"])
    assert not owed, f"calls {owed} never answered"
    last = request.messages[-1]
    if last["role"] == "assistant":  # a prefill
        assert last["content"] == last["content"].rstrip(), "a prefill may not end in whitespace"


def call(index: int, name: str, args: dict[str, Any] | str, *, pieces: int = 3) -> list[ModelOutput]:
    text = args if isinstance(args, str) else json.dumps(args)
    step = max(1, -(-len(text) // pieces))
    return [ToolCallStart(index, f"call_{index}", name),
            *(ToolCallArgs(index, text[i:i + step]) for i in range(0, len(text), step)), ToolCallEnd(index)]


def text(s: str, size: int = 5) -> list[ModelOutput]:
    return [ModelDelta(s[i:i + size]) for i in range(0, len(s), size)]


def reasoning(s: str) -> list[ModelOutput]:
    return [ReasoningDelta(s)]


def tools_round(*parts: list[ModelOutput]) -> NativeRound:
    return NativeRound([d for p in parts for d in p], finish="tool_calls")


def answer_round(answer: str, *parts: list[ModelOutput]) -> NativeRound:
    return NativeRound([*(d for p in parts for d in p), *text(answer)])
