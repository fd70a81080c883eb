"""Gates and the rules that open or shut them (docs/design.md#gates).

Every user-visible character of an action lane passes a gate (guarantee 1). A gate is `pending`
until the action type (and for call_tool the tool id) is known; while pending its output is
buffered. `allow` flushes the buffer and opens the lane; `deny` drops the buffer and swallows
the rest. `emitted_chars` counts only characters actually sent — it is what `streamed_state`
is built from, never the raw text.

The rules are data: `TRAIT_MATRIX` and `GATE_RULES`, applied in order, first verdict wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from actors.catalog import ASK_USER_TOOL, Catalog, Safety, Trait
from protocol.actions import ActionType
from protocol.frames import Mode
from protocol.notices import NoticeCode

E, X, N, U = Trait.EXPLORATION, Trait.EXPLOITATION, Trait.NEUTRAL, Trait.UNKNOWN

# (accepted, candidate) → may they share a round? An exploitation after an exploration is
# denied: it may read the in-flight result. Unknown is compatible with nothing.
TRAIT_MATRIX: Final[Mapping[tuple[Trait, Trait], bool]] = {
    (E, E): True,  (E, X): False, (E, N): True, (E, U): False,
    (X, E): True,  (X, X): True,  (X, N): True, (X, U): False,
    (N, E): True,  (N, X): True,  (N, N): True, (N, U): False,
    (U, E): False, (U, X): False, (U, N): False, (U, U): False,
}  # fmt: skip


def traits_compatible(accepted: Trait, candidate: Trait) -> bool:
    return TRAIT_MATRIX[accepted, candidate]


# The exploration-budget confirmation protocol (docs/design.md#exploration-budget).
EXPLORATION_MARKER: Final = "[[EXPLORATION_BUDGET]]"
CONTINUE_EXPLORING: Final = "Continue exploring"
STOP_EXPLORING: Final = "Stop for now"


class GateStatus(StrEnum):
    PENDING = "pending"
    ALLOWED = "allowed"
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class RoundRules:
    """Everything the gates need to know about the turn, fixed for one round."""

    catalog: Catalog
    state: str = "default"
    mode: Mode = Mode.AGENT
    max_actions: int = 2
    finish_legal: bool = True           # evaluated by the turn before the round (#observe-before-finish)
    finish_illegal_reason: str = ""
    confirmation_required: bool = False  # the next tool call must be the budget question (#exploration-budget)
    exploration_stopped: bool = False    # the user chose "Stop for now" (#exploration-budget)
    finalize_only: bool = False          # after a steer only complete/exit are available (#steer)
    validate_params: Callable[[str, Mapping[str, object]], list[str]] | None = None

    def tool_available(self, tool_id: str) -> bool:
        """The tool list of the current state and mode, as the model was shown it."""
        decl = self.catalog.get(tool_id)
        return (
            decl is not None
            and decl.available_in(self.state)
            and not (self.mode == Mode.ASK and decl.safety is Safety.WRITE)
            and not (self.exploration_stopped and decl.trait is Trait.EXPLORATION)
        )


@dataclass(frozen=True, slots=True)
class Candidate:
    index: int
    action: ActionType
    tool_id: str | None = None
    trait: Trait = Trait.UNKNOWN


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    code: NoticeCode | None = None
    message: str = ""


ALLOW: Final = Verdict(True)
Rule = Callable[[Candidate, Sequence[Candidate], RoundRules], Verdict | None]


def _too_many_actions(c: Candidate, accepted: Sequence[Candidate], rules: RoundRules) -> Verdict | None:
    if c.index >= rules.max_actions:
        return Verdict(
            False,
            NoticeCode.TOO_MANY_ACTIONS,
            f"action {c.index} exceeds the limit of {rules.max_actions} actions per round; it was not run",
        )
    return None


def _after_final(c: Candidate, accepted: Sequence[Candidate], rules: RoundRules) -> Verdict | None:
    final = next((a for a in accepted if a.action.is_final), None)
    if final is not None:
        return Verdict(
            False,
            NoticeCode.AFTER_FINAL,
            f"action {c.index} came after the final action {final.index} ({final.action}); it was not run",
        )
    return None


def _finish(c: Candidate, accepted: Sequence[Candidate], rules: RoundRules) -> Verdict | None:
    if not c.action.is_final:
        return None
    busy = [a for a in accepted if a.trait is not Trait.NEUTRAL]
    if busy:
        names = ", ".join(f"{a.tool_id} ({a.trait})" for a in busy)
        return Verdict(
            False,
            NoticeCode.ANSWER_LANE_DENIED,
            f"the {c.action} action was not shown: it shares the round with {names}, whose result "
            "you have not seen yet; the tool call runs, answer after its observation",
        )
    if not rules.finish_legal:
        return Verdict(False, NoticeCode.FINISH_ILLEGAL, rules.finish_illegal_reason)
    return ALLOW


def _tool(c: Candidate, accepted: Sequence[Candidate], rules: RoundRules) -> Verdict | None:
    tool_id = c.tool_id or ""
    decl = rules.catalog.get(tool_id)
    if rules.finalize_only:
        return Verdict(
            False, NoticeCode.TOOL_UNAVAILABLE,
            "the user steered the conversation: only complete or exit are available in this round",
        )
    if decl is None:
        return Verdict(False, NoticeCode.TOOL_CALL_INVALID, f"unknown tool {tool_id!r}")
    if not decl.available_in(rules.state):
        return Verdict(
            False, NoticeCode.TOOL_UNAVAILABLE, f"{tool_id} is not available in state {rules.state!r}; it was not run"
        )
    if rules.mode == Mode.ASK and decl.safety is Safety.WRITE:
        return Verdict(
            False, NoticeCode.ASK_MODE_DENIED,
            f"{tool_id} writes, and the conversation is in ask mode; it was not run",
        )
    if rules.exploration_stopped and decl.trait is Trait.EXPLORATION:
        return Verdict(
            False, NoticeCode.TOOL_UNAVAILABLE, f"{tool_id} was not run: the user stopped exploration for this turn"
        )
    if rules.confirmation_required and tool_id != ASK_USER_TOOL:
        return Verdict(
            False, NoticeCode.CONFIRMATION_REQUIRED,
            f"the exploration budget is spent: the next tool call must be {ASK_USER_TOOL} with "
            f"{EXPLORATION_MARKER} in the question and the options {CONTINUE_EXPLORING!r} / {STOP_EXPLORING!r}",
        )
    for a in accepted:
        if not traits_compatible(a.trait, c.trait):
            return Verdict(
                False, NoticeCode.INCOMPATIBLE_TRAITS,
                f"{tool_id} ({c.trait}) cannot share a round with {a.tool_id} ({a.trait}); it was not run",
            )
    return ALLOW


# Applied in order; the first rule with a verdict decides (docs/design.md#gates, rules 1–4).
GATE_RULES: Final[tuple[Rule, ...]] = (_too_many_actions, _after_final, _finish, _tool)


def decide(candidate: Candidate, accepted: Sequence[Candidate], rules: RoundRules) -> Verdict:
    for rule in GATE_RULES:
        verdict = rule(candidate, accepted, rules)
        if verdict is not None:
            return verdict
    return ALLOW


@dataclass(slots=True)
class Gate:
    """One action lane's gate."""

    index: int
    status: GateStatus = GateStatus.PENDING
    candidate: Candidate | None = None
    verdict: Verdict | None = None
    emitted_chars: int = 0
    _buffer: list[str] = field(default_factory=list)

    @property
    def shows_answer(self) -> bool:
        return self.status is GateStatus.ALLOWED and self.candidate is not None and self.candidate.action.is_final

    def settle(self, verdict: Verdict, candidate: Candidate | None) -> str:
        """Apply a verdict; returns the buffered text an allow releases (answer lanes only)."""
        self.verdict, self.candidate = verdict, candidate
        self.status = GateStatus.ALLOWED if verdict.allowed else GateStatus.DENIED
        released = "".join(self._buffer) if self.shows_answer else ""
        self._buffer.clear()
        self.emitted_chars += len(released)
        return released

    def pass_answer(self, text: str) -> str:
        """Answer characters arriving at the gate: buffered, released, or swallowed."""
        if self.status is GateStatus.PENDING:
            self._buffer.append(text)
            return ""
        if self.shows_answer:
            self.emitted_chars += len(text)
            return text
        return ""
