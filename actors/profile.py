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
    field_validator,
    model_validator,
)

from actors.catalog import Catalog, Safety, Trait
from protocol.native import function_name

BUILTIN_DIR = Path(__file__).resolve().parent / "builtin"
DEMO_PROFILE = BUILTIN_DIR / "demo.toml"
SCRIPTED_PROVIDER = "scripted"  # same as actors.llm.scripts.PROVIDER; not imported, to keep litellm's package out

FinishPolicy = Literal["observe", "allow_no_tool"]
Name = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[StrictInt, Field(gt=0)]
NonNegativeInt = Annotated[StrictInt, Field(ge=0)]
PositiveSeconds = Annotated[StrictFloat | StrictInt, Field(gt=0)]

_DEFER_CHECKS = "reactgate.profile.defer_checks"
BUILTIN_PREFIXES = frozenset({"demo", "react"})   # the built-in tools' namespaces: no MCP server may take them


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
    preamble_hold_chars: NonNegativeInt = 120     # native: content held back to tell a preamble from an answer


# -- MCP servers (docs/design.md#mcp-servers): declared here, talked to by actors/tools/mcp.py ------


class McpToolEntry(BaseModel):
    """A declared tool: what the gates decide from (docs/design.md#traits). Only these are offered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trait: Trait
    safety: Safety = Safety.SAFE
    uses_code: bool = False
    transitions_state: bool = False
    confirm: bool = False       # each call waits for the user's approval (docs/design.md#execute-confirmation)


class McpServerConfig(BaseModel):
    """One `[[mcp_servers]]` entry of a profile. Pickled into every process that runs tools.

    Treat `env` and `tools` as read-only: the config is hashed by value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    command: tuple[str, ...] | None = None   # stdio: the program and its arguments
    url: str | None = None                   # streamable HTTP endpoint
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)  # over the SDK's minimal inherited environment
    startup_timeout_s: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    call_timeout_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    tools: dict[str, McpToolEntry]

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not name or "." in name:
            raise ValueError("must be non-empty and contain no '.': the server's tools are named '<name>.<tool>'")
        return name

    @field_validator("command")
    @classmethod
    def _runnable_command(cls, command: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if command is not None and (not command or not command[0]):
            raise ValueError('must name the program to run, e.g. ["python", "notes_server.py"]')
        return command

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL (a streamable HTTP endpoint)")
        return url

    @field_validator("tools")
    @classmethod
    def _some_tools(cls, tools: dict[str, McpToolEntry]) -> dict[str, McpToolEntry]:
        if not tools:
            raise ValueError("declare at least one tool: only declared tools are offered to the model")
        if "" in tools:
            raise ValueError("a tool name must be non-empty")
        return tools

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of command (a stdio server) or url (a streamable HTTP server)")
        if self.url is not None and (self.cwd is not None or self.env):
            raise ValueError("cwd and env apply to a command, not to a url")
        return self

    def __hash__(self) -> int:
        return hash((self.name, self.command, self.url, self.cwd, tuple(sorted(self.env.items())),
                     self.startup_timeout_s, self.call_timeout_s, tuple(sorted(self.tools.items()))))

    def tool_id(self, name: str) -> str:
        return f"{self.name}.{name}"


class ToolEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Name
    impl: Name | None = None            # "module:attr" of a @tool function or a Tool; None: a built-in tool
    states: tuple[Name, ...] | None = Field(default=None, min_length=1)  # None: every state
    trait: Trait | None = None                                           # per-profile override
    confirm: bool | None = None   # per-profile: each call waits for the user's approval (None: the tool's own)


# Completion parameters the runtime sets itself: a profile that sets them would break a guarantee
# (streaming, counted calls with no hidden retries, the scripted model's headers) or leak a key.
RESERVED_SETTINGS = {
    "model": "set by `model` / `fallbacks`",
    "messages": "built by the runtime",
    "stream": "the runtime always streams",
    "extra_headers": "carries the conversation's call index",
    "max_retries": "no hidden retries: every model call is counted",
    "num_retries": "no hidden retries: every model call is counted",
    "api_key": "never write a key in a profile: name its environment variable in `api_key_env`",
}


# How a model's stream is read (docs/design.md#model-settings): "fast" — our SSE reader where the
# provider speaks OpenAI chat or Anthropic Messages (actors/llm/fast.py), LiteLLM's elsewhere; or
# "litellm" — always LiteLLM's.
STREAM_READERS = ("fast", "litellm")


class ModelSettings(BaseModel):
    """LiteLLM completion parameters for one model (docs/design.md#model-settings): `api_base`,
    `api_key_env` (the *name* of the variable holding the key, read where the model is called),
    and any other parameter LiteLLM accepts (temperature, max_tokens, top_p, …)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    api_base: str | None = None
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None

    @model_validator(mode="after")
    def _no_reserved(self) -> ModelSettings:
        for key in self.model_extra or {}:
            if key in RESERVED_SETTINGS:
                raise ValueError(f"{key!r} cannot be set here: {RESERVED_SETTINGS[key]}")
        reader = (self.model_extra or {}).get("stream_reader", "fast")
        if reader not in STREAM_READERS:
            raise ValueError(f"stream_reader must be one of {list(STREAM_READERS)}, not {reader!r}")
        return self

    def call_settings(self) -> dict[str, Any]:
        """What goes to the model call, the key still named, not read."""
        return self.model_dump(exclude_none=True)


class McpFace(BaseModel):
    """`[mcp_face]`: how external clients see this agent through the gateway's MCP face
    (docs/design.md#mcp-face). A token claim may choose another access mode; a client never raises it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    access: Literal["observe", "execute"] = "observe"   # without a claim: observe = ask mode, execute = agent mode
    catalog_max: PositiveInt = 32       # past this many tools: the core tools and `search_capabilities` only
    core_tools: tuple[Name, ...] = ()   # always listed (besides `react.ask_user`); the rest is found by search


# How the model states its decisions (docs/design.md#decision-protocol, #native): channel-tagged text
# with JSON action blocks, or the model's own function calling.
Decision = Literal["channels", "native"]


class AgentProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    # What GET /agents and the console show of the agent (docs/design.md#several-agents); unset, the
    # first line of its instructions.
    description: str | None = None
    model: Name
    decision: Decision = "channels"
    fallbacks: tuple[Name, ...] = ()
    # Placed in the system prompt ahead of the protocol rules. `instructions_file` (relative to the
    # profile) is read when the profile is loaded, into `instructions`.
    instructions: str | None = None
    instructions_file: Name | None = None
    model_settings: ModelSettings = ModelSettings()
    fallback_settings: dict[str, ModelSettings] = {}   # per fallback model
    states: tuple[Name, ...] = Field(default=("default",), min_length=1)
    initial_state: Name | None = None  # None: the first state
    policies: Policies = Policies()
    tools: tuple[ToolEntry, ...] = ()
    # ray backend: "sharded" (many conversations per ConversationHost) or "dedicated" (one named
    # Ray actor per conversation: process isolation, ~90 MB each — docs/design.md#placement)
    placement: Literal["sharded", "dedicated"] = "sharded"
    # Every tool whose safety is `write` waits for the user's approval (docs/design.md#execute-confirmation).
    confirm_writes: bool = False
    mcp_servers: tuple[McpServerConfig, ...] = ()
    mcp_face: McpFace = McpFace()

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
        if self.instructions is not None and self.instructions_file is not None:
            out.append(("instructions_file", "give `instructions` or `instructions_file`, not both"))
        for model in self.fallback_settings:
            if model not in self.fallbacks:
                out.append((f"fallback_settings.{model}", f"{model!r} is not one of the fallbacks {list(self.fallbacks)}"))
        seen: set[str] = set()
        for i, tool in enumerate(self.tools):
            if tool.id in seen:
                out.append((f"tools[{i}].id", f"duplicate tool id {tool.id!r}"))
            seen.add(tool.id)
            if known_tools is not None and tool.impl is None and tool.id not in known_tools:
                out.append((f"tools[{i}].id", f"unknown tool {tool.id!r} (a tool of your own needs `impl`)"))
            for state in tool.states or ():
                if state not in states:
                    out.append((f"tools[{i}].states", f"{state!r} is not one of the states {list(self.states)}"))
        if self.decision == "native":  # a function name must say which tool it calls
            by_name: dict[str, str] = {}
            for tool_id in self.tool_ids:
                other = by_name.setdefault(function_name(tool_id), tool_id)
                if other != tool_id:
                    out.append(("tools", f"{other!r} and {tool_id!r} both become the function {function_name(tool_id)!r}"))
        names: set[str] = set()
        for i, server in enumerate(self.mcp_servers):
            if server.name in names:
                out.append((f"mcp_servers[{i}].name", f"duplicate server name {server.name!r}"))
            names.add(server.name)
            if server.name in BUILTIN_PREFIXES:
                out.append((f"mcp_servers[{i}].name", f"{server.name!r} is reserved for the built-in tools"))
            for name in server.tools:
                if server.tool_id(name) in seen:
                    out.append((f"mcp_servers[{i}].tools.{name}", f"{server.tool_id(name)!r} is also in [[tools]]"))
        for i, tool_id in enumerate(self.mcp_face.core_tools):
            if tool_id not in self.tool_ids:
                out.append((f"mcp_face.core_tools[{i}]", f"{tool_id!r} is not one of this agent's tools"))
        return out

    # -- what the runtime reads ----------------------------------------------------------------

    @property
    def summary(self) -> str:
        """The description GET /agents lists: `description`, else the first line of the instructions, else ""."""
        if self.description is not None:
            return self.description.strip()
        lines = (self.instructions or "").strip().splitlines()
        return lines[0].strip() if lines else ""

    @property
    def models(self) -> tuple[str, ...]:
        """The model and its fallbacks, in the order `stream_model` tries them."""
        return (self.model, *self.fallbacks)

    @property
    def tool_ids(self) -> tuple[str, ...]:
        """Every tool the agent has: its `[[tools]]` and its MCP servers' declared tools."""
        return tuple(t.id for t in self.tools) + self.mcp_tool_ids

    @property
    def mcp_tool_ids(self) -> tuple[str, ...]:
        return tuple(server.tool_id(name) for server in self.mcp_servers for name in server.tools)

    def settings_for(self, model: str) -> dict[str, Any]:
        """The completion parameters of `model`: `model_settings` for the model, `fallback_settings`
        for a fallback (a model that is both uses the model's)."""
        chosen = self.model_settings if model == self.model else self.fallback_settings.get(model, ModelSettings())
        return chosen.call_settings()

    def catalog_from(self, everything: Catalog) -> Catalog:
        """This agent's tools out of every tool a runtime has, with the profile's trait overrides and
        availability: what its gates decide from and its prompt lists."""
        mine = everything.restricted_to(self.tool_ids)
        return mine.with_overrides(self.trait_overrides(), self.tool_states(), self.confirm_overrides(mine))

    def tool_states(self) -> dict[str, frozenset[str] | None]:
        """Availability matrix (docs/design.md#states): tool id → states it is available in (None: all)."""
        return {t.id: None if t.states is None else frozenset(t.states) for t in self.tools}

    def confirm_overrides(self, catalog: Catalog) -> dict[str, bool]:
        """Which tools wait for the user's approval: `confirm_writes` marks every write tool, and a
        `[[tools]]` entry's `confirm` overrides (docs/design.md#execute-confirmation)."""
        out = {d.tool_id: True for d in catalog if self.confirm_writes and d.safety is Safety.WRITE}
        out |= {t.id: t.confirm for t in self.tools if t.confirm is not None}
        return out

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
        path, source, text = None, "<profile>", path_or_text
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{source}: invalid TOML: {exc}") from None
    profile = parse_profile(data, known_tools, source)
    if profile.instructions_file is not None:
        where = (path.parent if path is not None else Path.cwd()) / profile.instructions_file
        try:
            instructions = where.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(f"{source}: instructions_file: cannot read {where}: {exc.strerror or exc}") from None
        profile = profile.model_copy(update={"instructions": instructions})
    if path is not None and profile.mcp_servers:
        # A stdio server runs in the profile's directory unless its `cwd` says otherwise (relative
        # to the profile, too): `command = ["python", "notes_server.py"]` finds the file beside it.
        here = path.resolve().parent
        servers = tuple(
            s.model_copy(update={"cwd": str(here / s.cwd) if s.cwd else str(here)}) if s.command else s
            for s in profile.mcp_servers
        )
        profile = profile.model_copy(update={"mcp_servers": servers})
    return profile


def demo_profile(known_tools: Container[str] | None = None) -> AgentProfile:
    """The built-in demo agent (docs/design.md#demo-tools): states default + focused, model `scripted/demo`."""
    return load_profile(DEMO_PROFILE, known_tools)
