"""Agent profiles: the TOML an operator writes to define an agent (docs/design.md#profiles).

A profile names the model and its ordered fallbacks, the agent's states and initial state, its
policies (limits, finish policy), and its tools with the states each is available in and an
optional per-profile trait override (docs/design.md#traits, docs/design.md#states). A bad profile is a start-up error whose
message names the file and the offending field, e.g.
`demo.toml: policies.max_iterations: Input should be greater than 0`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Container, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from actors.catalog import Trait

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
DEMO_PROFILE = BUILTIN_DIR / "demo.toml"
SCRIPTED_PROVIDER = "scripted"  # same as actors.llm.scripts.PROVIDER; not imported, to keep litellm's package out

FinishPolicy = Literal["observe", "allow_no_tool"]
Name = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
PositiveSeconds = Annotated[StrictFloat | StrictInt, Field(gt=0)]

_DEFER_CHECKS = "reactgate.profile.defer_checks"


class ProfileError(ValueError):
    """A profile that cannot be served. The message names the source and each offending field."""


class Policies(BaseModel):
    """Per-agent limits and rules; the defaults are those of docs/design.md#profiles."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_actions_per_round: PositiveInt = 2
    max_iterations: PositiveInt = 15
    max_protocol_retries: NonNegativeInt = 3      # 0: a protocol violation ends the turn at once
    finish_policy: FinishPolicy = "observe"
    exploration_soft_cap: PositiveInt = 7
    ask_user_timeout_s: PositiveSeconds = 300
    tool_timeout_s: PositiveSeconds = 30
    auto_continue_max: NonNegativeInt = 2         # per round, length cuts and connection cuts together; 0: never
    stream_idle_timeout_s: PositiveSeconds = 60   # silence after the first delta that cuts the stream
    context_budget_tokens: PositiveInt = 32000
    flush_interval_ms: NonNegativeInt = 25        # 0: no coalescing


class ToolEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Name
    states: tuple[Name, ...] | None = Field(default=None, min_length=1)  # None: every state
    trait: Trait | None = None                                           # per-profile override


class AgentProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    model: Name
    fallbacks: tuple[Name, ...] = ()
    states: tuple[Name, ...] = Field(default=("default",), min_length=1)
    initial_state: Name | None = None  # None: the first state
    policies: Policies = Policies()
    tools: tuple[ToolEntry, ...] = ()
    # ray backend: "sharded" (many conversations per ConversationHost) or "dedicated" (one named
    # Ray actor per conversation: process isolation, ~90 MB each — docs/design.md#placement)
    placement: Literal["sharded", "dedicated"] = "sharded"

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> AgentProfile:
        if self.initial_state is None:
            object.__setattr__(self, "initial_state", self.states[0])
        # docs/design.md#observe-before-finish: `observe` is the default *when the agent has tools*; a tool-less agent
        # could never observe anything.
        if not self.tools and "finish_policy" not in self.policies.model_fields_set:
            object.__setattr__(self, "policies", self.policies.model_copy(update={"finish_policy": "allow_no_tool"}))
        if not (info.context or {}).get(_DEFER_CHECKS):
            problems = self.problems()
            if problems:
                raise ValueError("; ".join(f"{where}: {msg}" for where, msg in problems))
        return self

    def problems(self, known_tools: Container[str] | None = None) -> list[tuple[str, str]]:
        """Cross-field violations as (field path, message); `known_tools` also checks tool ids."""
        out: list[tuple[str, str]] = []
        states = set(self.states)
        if len(states) != len(self.states):
            out.append(("states", f"duplicate state names in {list(self.states)}"))
        if self.initial_state not in states:
            out.append(("initial_state", f"{self.initial_state!r} is not one of the states {list(self.states)}"))
        seen: set[str] = set()
        for i, tool in enumerate(self.tools):
            if tool.id in seen:
                out.append((f"tools[{i}].id", f"duplicate tool id {tool.id!r}"))
            seen.add(tool.id)
            if known_tools is not None and tool.id not in known_tools:
                out.append((f"tools[{i}].id", f"unknown tool {tool.id!r}"))
            for state in tool.states or ():
                if state not in states:
                    out.append((f"tools[{i}].states", f"{state!r} is not one of the states {list(self.states)}"))
        return out

    # -- what the runtime reads ----------------------------------------------------------------

    @property
    def models(self) -> tuple[str, ...]:
        """The model and its fallbacks, in the order `stream_model` tries them."""
        return (self.model, *self.fallbacks)

    @property
    def tool_ids(self) -> tuple[str, ...]:
        return tuple(t.id for t in self.tools)

    def tool_states(self) -> dict[str, frozenset[str] | None]:
        """Availability matrix (docs/design.md#states): tool id → states it is available in (None: all)."""
        return {t.id: None if t.states is None else frozenset(t.states) for t in self.tools}

    def trait_overrides(self) -> dict[str, Trait]:
        return {t.id: t.trait for t in self.tools if t.trait is not None}

    def tools_in(self, state: str) -> tuple[str, ...]:
        return tuple(t.id for t in self.tools if t.states is None or state in t.states)

    def with_script(self, name: str) -> AgentProfile:
        """A copy whose model and fallbacks all play script `name` (`--script F`, docs/design.md#profiles)."""
        scripted = f"{SCRIPTED_PROVIDER}/{name}"
        return self.model_copy(update={"model": scripted, "fallbacks": tuple(scripted for _ in self.fallbacks)})

    def with_model(self, model: str) -> AgentProfile:
        """A copy served by `model` (`--model M`); the fallbacks stay."""
        return self.model_copy(update={"model": model})


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def parse_profile(
    data: Mapping[str, Any], known_tools: Container[str] | None = None, source: str = "<profile>"
) -> AgentProfile:
    try:
        profile = AgentProfile.model_validate(data, context={_DEFER_CHECKS: True})
    except ValidationError as exc:
        lines = [f"{source}: {_path(tuple(e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ProfileError("\n".join(lines)) from None
    problems = profile.problems(known_tools)
    if problems:
        raise ProfileError("\n".join(f"{source}: {where}: {msg}" for where, msg in problems))
    return profile


def load_profile(path_or_text: str | Path, known_tools: Container[str] | None) -> AgentProfile:
    """Load and validate a profile from a TOML file (a `Path`, or a str naming a file) or TOML text.

    `known_tools`: the tool ids the server can run; None skips that check.
    Raises ProfileError naming the file and the offending field.
    """
    if isinstance(path_or_text, Path) or ("\n" not in path_or_text and "=" not in path_or_text):
        path = Path(path_or_text)
        source = path.name
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read profile: {exc.strerror or exc}") from None
    else:
        source, text = "<profile>", path_or_text
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: invalid TOML: {exc}") from None
    return parse_profile(data, known_tools, source)


def demo_profile(known_tools: Container[str] | None = None) -> AgentProfile:
    """The built-in demo agent (docs/design.md#demo-tools): states default + focused, model `scripted/demo`."""
    return load_profile(DEMO_PROFILE, known_tools)
