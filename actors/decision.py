"""The two decision protocols a profile may speak (docs/design.md#decision-protocol, #native), as
one interface the turn, replay and recovery use: `DECISIONS[profile.decision]`.

Everything that differs between channel-tagged text and the model's own function calling is here:
the engine's decoder, the request (system prompt, history, functions), how a cut answer is asked
to go on, how a round a crash cut is rebuilt, and what a round leaves in the timeline and the
store. Everything else — gates, rules, the turn machine — is one implementation for both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from actors import native
from actors.catalog import Catalog, ToolDecl
from actors.context import Message, Step, TokenCounter, assemble, ledger_summary, system_prompt
from actors.continuation import CONTINUE_PROMPT, CUT_PROMPT, RestartCheck, continue_messages, rebuilt_response
from actors.gates import RoundRules
from actors.profile import Policies
from actors.round import RoundEngine, RoundEvent, RoundResult
from actors.turn_machine import StreamEnd
from protocol.channels import json_escape
from protocol.deltas import ModelDelta, ToolCallStart
from protocol.events import ToolCalled
from protocol.native import NativeDecoder
from protocol.timeline import Block, ModelMessageBlock, NativeCall


class Prompt(Protocol):
    """What a request is built from (the conversation, as the turn sees it)."""

    @property
    def agent_name(self) -> str: ...
    @property
    def instructions(self) -> str | None: ...
    @property
    def policies(self) -> Policies: ...
    @property
    def timeline(self) -> Sequence[Block]: ...
    @property
    def ledger(self) -> Sequence[Step]: ...
    def prompt_counter(self) -> TokenCounter:
        """The token counter of the prompt being built (actors/context.py `PromptCounts`)."""
        ...


class Decision(Protocol):
    name: str

    def engine(self, rules: RoundRules, *, turn_id: str, round_no: int, rebuilt: bool = False) -> RoundEngine: ...
    def request(self, ctx: Prompt, rules: RoundRules, *, turn_id: str, allow_no_tool: bool,
                exploration_cap: int) -> tuple[list[Message], list[dict[str, Any]] | None]: ...
    def continuation(self, base: list[Message], engine: RoundEngine, end: StreamEnd, model: str
                     ) -> tuple[list[Message], RestartCheck | None]: ...
    def rebuilt(self, thinking: str, announced: Sequence[ToolCalled], answer: str) -> str: ...
    def extended(self, raw: str, answer: str) -> str: ...
    def feed(self, engine: RoundEngine, raw: str) -> list[RoundEvent]: ...
    def output(self, engine: RoundEngine) -> str: ...
    def message(self, engine: RoundEngine, result: RoundResult, *, turn_id: str, round_no: int) -> Block | None: ...


def _available(catalog: Catalog, rules: RoundRules) -> list[ToolDecl]:
    return [d for d in catalog if rules.tool_available(d.tool_id)]


class Channels:
    """Channel-tagged text with JSON action blocks (docs/design.md#decision-protocol)."""

    name = "channels"

    def __init__(self, catalog: Catalog, policies: Policies) -> None:
        self.catalog = catalog
        self.policies = policies

    def engine(self, rules: RoundRules, *, turn_id: str, round_no: int, rebuilt: bool = False) -> RoundEngine:
        return RoundEngine(rules, turn_id=turn_id, round_no=round_no)

    def request(self, ctx: Prompt, rules: RoundRules, *, turn_id: str, allow_no_tool: bool,
                exploration_cap: int) -> tuple[list[Message], list[dict[str, Any]] | None]:
        pol = self.policies
        system = system_prompt(
            agent=ctx.agent_name, state=rules.state, mode=rules.mode,
            tools=_available(self.catalog, rules) if not rules.finalize_only else [],
            max_actions=pol.max_actions_per_round, exploration_cap=exploration_cap, allow_no_tool=allow_no_tool,
            ledger=ledger_summary(ctx.ledger), instructions=ctx.instructions,
        )
        messages = assemble(system, ctx.timeline, turn_id=turn_id, budget_tokens=pol.context_budget_tokens,
                            count_tokens=ctx.prompt_counter())
        return messages, None

    def continuation(self, base: list[Message], engine: RoundEngine, end: StreamEnd, model: str
                     ) -> tuple[list[Message], RestartCheck | None]:
        if end is StreamEnd.LENGTH:
            return continue_messages(base, engine.raw_text(), CONTINUE_PROMPT), None
        return continue_messages(base, engine.raw_text(), CUT_PROMPT), RestartCheck(engine.answer_text())

    def rebuilt(self, thinking: str, announced: Sequence[ToolCalled], answer: str) -> str:
        return rebuilt_response(thinking, announced, answer)

    def extended(self, raw: str, answer: str) -> str:
        return raw + json_escape(answer)

    def feed(self, engine: RoundEngine, raw: str) -> list[RoundEvent]:
        return engine.feed(raw) if raw else []

    def output(self, engine: RoundEngine) -> str:
        return engine.raw_text()

    def message(self, engine: RoundEngine, result: RoundResult, *, turn_id: str, round_no: int) -> Block | None:
        return None  # the thinking, call and notice blocks are the channel history


class Native:
    """The model's own function calling, governed the same way (docs/design.md#native)."""

    name = "native"

    def __init__(self, catalog: Catalog, policies: Policies) -> None:
        self.catalog = catalog
        self.policies = policies
        self.names = native.function_names(catalog)
        self.code_tools = frozenset(d.tool_id for d in catalog if d.uses_code)

    def engine(self, rules: RoundRules, *, turn_id: str, round_no: int, rebuilt: bool = False) -> RoundEngine:
        # Where finishing is not legal, content can never be an answer: held until a call or the end.
        # A finalize round offers no call; a rebuilt round's answer was already shown.
        if rebuilt or rules.finalize_only:
            hold: int | None = 0
        else:
            hold = self.policies.preamble_hold_chars if rules.finish_legal else None
        decoder = NativeDecoder(self.names, hold_chars=hold, code_tools=self.code_tools)
        return RoundEngine(rules, turn_id=turn_id, round_no=round_no, native=decoder)

    def request(self, ctx: Prompt, rules: RoundRules, *, turn_id: str, allow_no_tool: bool,
                exploration_cap: int) -> tuple[list[Message], list[dict[str, Any]] | None]:
        pol = self.policies
        system = native.system_prompt(
            agent=ctx.agent_name, state=rules.state, mode=rules.mode, max_actions=pol.max_actions_per_round,
            exploration_cap=exploration_cap, allow_no_tool=allow_no_tool, ledger=ledger_summary(ctx.ledger),
            instructions=ctx.instructions,
        )
        messages = assemble(system, ctx.timeline, turn_id=turn_id, budget_tokens=pol.context_budget_tokens,
                            count_tokens=ctx.prompt_counter(), render=native.render_history)
        # A finalize round offers what the state offers, so a history holding calls stays a valid
        # request; the steer asks for an answer, and rule 4a denies any call.
        tools = native.functions(_available(self.catalog, rules))
        return messages, tools or None

    def continuation(self, base: list[Message], engine: RoundEngine, end: StreamEnd, model: str
                     ) -> tuple[list[Message], RestartCheck | None]:
        answer = engine.answer_text()
        prefill = prefills(model)
        prompt = CONTINUE_PROMPT if end is StreamEnd.LENGTH else CUT_PROMPT
        messages = native.continue_messages(base, answer, prompt, prefill=prefill)
        trim = answer[len(answer.rstrip()):] if prefill else ""
        return messages, RestartCheck(answer, opening=None, trim=trim)

    def rebuilt(self, thinking: str, announced: Sequence[ToolCalled], answer: str) -> str:
        return native.recorded(native.rebuilt_deltas(thinking, announced, answer))

    def extended(self, raw: str, answer: str) -> str:
        return native.recorded([*native.replayed(raw), ModelDelta(answer)])

    def feed(self, engine: RoundEngine, raw: str) -> list[RoundEvent]:
        events: list[RoundEvent] = []
        for delta in native.replayed(raw) if native.is_native(raw) else ():
            events += engine.feed_delta(delta)
        return events

    def output(self, engine: RoundEngine) -> str:
        return native.recorded(engine.raw_deltas())

    def message(self, engine: RoundEngine, result: RoundResult, *, turn_id: str, round_no: int) -> Block | None:
        """Every call the model made this round (accepted ones with their params, refused ones with
        none), its preamble and its signed thinking: the round's assistant message."""
        params = {c.index: dict(c.call.params) | ({"code": c.call.code} if c.call.code is not None else {})
                  for c in result.calls}
        calls = [NativeCall(index, tool_id, params.get(index)) for index, tool_id in engine.native_calls().items()]
        deltas = engine.raw_deltas()
        return ModelMessageBlock(turn_id, round_no, content=native_preamble(deltas), calls=calls,
                                 reasoning=native.thinking_blocks(deltas))


def native_preamble(deltas: Sequence[Any]) -> str:
    """The content a message wrote before its first call (its preamble), or "" if it made none."""
    text: list[str] = []
    for d in deltas:
        if type(d) is ModelDelta:
            text.append(d.text)
        elif type(d) is ToolCallStart:
            return "".join(text)
    return ""


def prefills(model: str) -> bool:
    """Whether a cut answer is continued as an assistant prefill: Anthropic's Messages API takes one."""
    return model.split("/", 1)[0] == "anthropic"


DECISIONS: Final[Mapping[str, type[Channels] | type[Native]]] = {"channels": Channels, "native": Native}


def decision_for(decision: str, catalog: Catalog, policies: Policies) -> Decision:
    return DECISIONS[decision](catalog, policies)
