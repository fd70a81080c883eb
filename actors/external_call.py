"""External calls: an outside agent calling this agent's tools in one of its conversations, under the
same policy as the agent's own calls (docs/design.md#mcp-face). Sans-I/O.

The MCP face (gateway/mcp_face.py) binds each of its sessions to a conversation; every call of that
session is decided here and carried out by the conversation (`Conversation.external_call`), which
runs it through the same tool executor as a turn does. Nothing here is a second copy of a rule:
- the gates are the round's (`actors/gates.py` `decide`): an external call is a candidate whose
  accepted actions are the session's calls still in flight, so the state (rule 4c), the ask-mode
  ceiling (4d), "Stop for now" (4e), the budget question (4f) and the trait matrix (4g) decide it;
- each session's budget, approvals and tool-call backstop are a `TurnMachine` over a `TurnProgress`
  of its own (`ExternalSession.progress`), the machine a turn keeps them in;
- the catalog a client is shown is the one the gates decide from (`RoundRules.tool_available`).

What is the face's own: the access mode (`Access`), which never raises the conversation's mode, and
which route a `confirm` call's approval takes (`approval_route`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import msgspec

from actors.catalog import ASK_USER_TOOL, Catalog, Observation, ToolCall, ToolDecl, Trait
from actors.gates import Candidate, RoundRules, decide
from actors.identity import Caller
from actors.profile import AgentProfile, Policies
from actors.round import AcceptedCall, budget_question_problem
from actors.turn_machine import TurnMachine, TurnProgress
from protocol.actions import ActionType
from protocol.events import ExternalClient
from protocol.frames import Mode
from protocol.notices import Notice, NoticeCode


class Access(StrEnum):
    """What an external client may do (docs/design.md#mcp-face): chosen by a token claim or by the
    agent's profile, never raised by the client."""

    OBSERVE = "observe"   # ask mode: write tools are absent, a call of one is ASK_MODE_DENIED
    EXECUTE = "execute"   # agent mode: the agent's whole toolset, under its rules


# The conversation mode each access mode maps to (docs/design.md#ask-mode).
ACCESS_MODES: Final[Mapping[Access, Mode]] = {
    Access.OBSERVE: Mode.ASK,
    Access.EXECUTE: Mode.AGENT,
}


def effective_mode(access: Access, conversation_mode: Mode) -> Mode:
    """The stricter of the session's access mode and the conversation's own mode: an observe client
    never writes, and an execute client of a conversation its owner put in ask mode does not either."""
    return Mode.ASK if Mode.ASK in (ACCESS_MODES[access], conversation_mode) else Mode.AGENT


class ExternalSession(msgspec.Struct, kw_only=True):
    """One external client's session in a conversation, as the conversation's snapshot keeps it. Its
    calls share one `TurnProgress`: the exploration budget's question, "Stop for now", "Approve all"
    and the tool-calls backstop count over the session, as over a turn."""

    session_id: str          # the `turn_id` of its events
    client: ExternalClient
    access: Access
    progress: TurnProgress

    @classmethod
    def new(cls, session_id: str, client: ExternalClient, access: Access) -> ExternalSession:
        return cls(session_id=session_id, client=client, access=access,
                   progress=TurnProgress(turn_id=session_id, message_id="", text=""))


class ExternalCall(msgspec.Struct, frozen=True, kw_only=True):
    """One call of an external client, as the face hands it to the conversation's host."""

    session_id: str
    client: ExternalClient
    access: Access
    call_id: str                 # unique in the conversation: the face makes it from its session and request
    tool_id: str
    params: dict[str, Any]
    caller: Caller | None = None
    elicit: bool = False         # the client can be asked for an approval itself (MCP elicitation)
    consent: str | None = None   # what the client's user answered an approval (`Consent`), when asked


class Refused(msgspec.Struct, frozen=True):
    """The gates refused the call: the notice the model would read, sent to the client as is."""

    notice: Notice


class ApprovalNeeded(msgspec.Struct, frozen=True):
    """The call waits for its user's yes (docs/design.md#execute-confirmation) and the client can be
    asked itself: ask it, then send the call again with its `consent`. Nothing was logged or run."""

    tool_id: str
    params: dict[str, Any]
    question: str


class Observed(msgspec.Struct, frozen=True):
    """The call's one observation (docs/design.md#observations), logged as its `tool.result`."""

    ok: bool
    result: dict[str, Any] | None = None
    error: str | None = None
    detail: dict[str, Any] | None = None

    @classmethod
    def of(cls, obs: Observation) -> Observed:
        return cls(obs.ok, dict(obs.result or {}) if obs.ok else None, None if obs.ok else obs.error,
                   dict(obs.detail) if not obs.ok and obs.detail else None)

    def payload(self) -> dict[str, Any]:
        """The JSON the model would read as this observation."""
        return dict(self.result or {}) if self.ok else {"error": self.error, **(self.detail or {})}


ExternalReply = Refused | ApprovalNeeded | Observed


class ExternalView(msgspec.Struct, frozen=True, kw_only=True):
    """What the face lists (`tools/list`): the bound conversation's agent, state and effective mode,
    and the tools available to this session now, as the gates would decide them."""

    agent: str
    access: Access
    state: str
    mode: Mode
    tools: tuple[ToolDecl, ...]
    confirmation_required: bool = False
    catalog_max: int = 32                  # the agent's `[mcp_face]`: past this, a compact list
    core_tools: tuple[str, ...] = ()


def offered(decl: ToolDecl) -> bool:
    """A tool the face can offer at all: a `uses_code` tool reads a code channel that only a model's
    round has (docs/design.md#decision-protocol)."""
    return not decl.uses_code


class ApprovalRoute(StrEnum):
    """Who is asked before a `confirm` call runs (docs/design.md#mcp-face)."""

    NONE = "none"           # nothing to ask: no confirm tool, or "Approve all" this session
    DECIDED = "decided"     # the client's user answered (the face elicited it)
    ELICIT = "elicit"       # ask the client's user first, through MCP elicitation
    OWNER = "owner"         # ask the conversation's owner, through the approval request on /ws


@dataclass(slots=True)
class ExternalRules:
    """One session's rules over its `TurnMachine`: what the session may call now, and what a call's
    observation changes."""

    session: ExternalSession
    machine: TurnMachine

    @classmethod
    def of(cls, session: ExternalSession, policies: Policies, states: Collection[str]) -> ExternalRules:
        return cls(session, TurnMachine(session.progress, policies, states))

    def rules(self, catalog: Catalog, *, state: str, conversation_mode: Mode,
              validate_params: Callable[[str, Mapping[str, object]], list[str]] | None = None) -> RoundRules:
        return self.machine.rules(catalog, state=state, mode=effective_mode(self.session.access, conversation_mode),
                                  finalize=False, validate_params=validate_params)

    def view(self, profile: AgentProfile, catalog: Catalog, *, state: str, conversation_mode: Mode) -> ExternalView:
        rules = self.rules(catalog, state=state, conversation_mode=conversation_mode)
        face = profile.mcp_face
        return ExternalView(agent=profile.name, access=self.session.access, state=state, mode=rules.mode,
                            tools=tuple(d for d in catalog if offered(d) and rules.tool_available(d.tool_id)),
                            confirmation_required=rules.confirmation_required, catalog_max=face.catalog_max,
                            core_tools=face.core_tools)

    def admit(self, call: ExternalCall, rules: RoundRules, in_flight: Sequence[Candidate]) -> Refused | ToolDecl:
        """The gates' verdict on the call (rules 4b–4h), with the session's calls in flight as the
        round's accepted actions; then its params, and the budget question's form. A refusal is the
        notice a model would read; else the tool's declaration."""
        decl = rules.catalog.get(call.tool_id)
        if decl is not None and not offered(decl):
            decl = None
        candidate = Candidate(0, ActionType.CALL_TOOL, call.tool_id, decl.trait if decl else Trait.UNKNOWN)
        verdict = decide(candidate, in_flight, rules) if decl is not None else None
        if decl is None or verdict is None:   # rule 4b, as a model's unknown tool id
            return Refused(Notice(code=NoticeCode.TOOL_CALL_INVALID, message=f"unknown tool {call.tool_id!r}",
                                  tool_id=call.tool_id))
        if not verdict.allowed:
            return Refused(Notice(code=verdict.code or NoticeCode.TOOL_UNAVAILABLE, message=verdict.message,
                                  tool_id=call.tool_id))
        violations = rules.validate_params(call.tool_id, call.params) if rules.validate_params else []
        if violations:
            return Refused(Notice(code=NoticeCode.TOOL_CALL_INVALID, message=f"the params of {call.tool_id} are invalid",
                                  tool_id=call.tool_id, violations=tuple(violations)))
        problem = budget_question_problem(rules, call.tool_id, call.params)
        if problem is not None:
            return Refused(problem)
        return decl

    def approval_route(self, call: ExternalCall, decl: ToolDecl) -> ApprovalRoute:
        if not self.machine.needs_approval(call.call_id, decl):
            return ApprovalRoute.NONE
        if call.consent is not None:
            return ApprovalRoute.DECIDED
        return ApprovalRoute.ELICIT if call.elicit else ApprovalRoute.OWNER

    def admitted(self, call: ExternalCall, decl: ToolDecl, limit: int | None) -> bool:
        """The tool-calls backstop (docs/design.md#quotas), counted over the session as over a turn:
        the call is admitted to run (and counted), or refused with `quota_exceeded`."""
        accepted = AcceptedCall(0, ToolCall(call.call_id, call.tool_id, call.params), decl.trait)
        admitted, _ = self.machine.admit([accepted], limit)
        return bool(admitted)

    def is_question(self, decl: ToolDecl) -> bool:
        return decl.tool_id == ASK_USER_TOOL
