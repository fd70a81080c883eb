"""An agent, loaded: its profile and the tools it runs (docs/design.md#your-own-agent).

`load_agent` is what `reactgate serve` and `reactgate agent check` both call, so a profile that
check accepts is one serve accepts. It imports every `impl` and starts every MCP server once, at
start-up: a missing module, a non-tool attribute, an undeclared MCP tool or a server that does
not come up is a `ProfileError` naming the profile and the field, never a crash later on a host.

The registry it returns rebuilds itself in any process it is pickled into (a ConversationHost, the
tool pool): it carries its `ToolSources` — the `impl` strings, the directories to import them from
and the MCP tools discovered here — not the tools, so every runtime that runs tools loads the same
tools, and no MCP server is asked again.

`load_agents` loads several (docs/design.md#several-agents): one runtime serves them all, so their
tools go into one registry — each conversation's gates still see only its own agent's tools. What
cannot share one process is refused at start-up, naming both files: two agents of one name, one tool
id or MCP server name meaning two things, two modules of one name beside two profiles.
"""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.identity import CALLER_META
from actors.profile import AgentProfile, ProfileError, demo_profile, load_profile
from actors.tools.demo import demo_tools
from actors.tools.functions import ToolLoadError, load_tool
from actors.tools.registry import SchemaParams, Tool, ToolContext, ToolRegistry

if TYPE_CHECKING:
    from actors.profile import McpServerConfig
    from actors.tools.mcp import McpToolSpec


@dataclass(frozen=True)
class ToolSources:
    """How to build an agent's tools in any process: small, picklable, no tool objects."""

    functions: tuple[tuple[str, str], ...] = ()          # (tool id, "module:attr")
    search_path: tuple[str, ...] = ()                    # directories `impl` modules are imported from
    mcp: tuple[tuple[McpServerConfig, tuple[McpToolSpec, ...]], ...] = ()


@dataclass(frozen=True)
class Agent:
    profile: AgentProfile
    registry: ToolRegistry
    sources: ToolSources


def build_registry(sources: ToolSources) -> ToolRegistry:
    """The built-in tools plus the sources' own: what every process that runs tools builds."""
    tools: list[Tool[Any]] = demo_tools()
    tools += [load_tool(tool_id, impl, sources.search_path) for tool_id, impl in sources.functions]
    tools += [mcp_tool(server, spec) for server, specs in sources.mcp for spec in specs]
    return ToolRegistry(tools, rebuild=(build_registry, (sources,)))


def mcp_tool(server: McpServerConfig, spec: McpToolSpec) -> Tool[Any]:
    """An MCP server's tool as one of ours: its declared traits, its inputSchema as the params schema,
    its calls through this process's one session with that server."""
    from actors.tools.mcp import sessions  # the mcp SDK is imported only where an agent has MCP servers

    entry = server.tools[spec.name]

    async def handler(params: SchemaParams, ctx: ToolContext) -> dict[str, Any]:
        # The caller rides in the request's `_meta` (docs/design.md#mcp-servers); never the token.
        meta = {CALLER_META: ctx.caller.as_meta()} if ctx.caller is not None else None
        return await sessions().call(server, spec.name, params.model_dump(), meta=meta)

    return Tool(server.tool_id(spec.name), SchemaParams, handler, entry.trait, entry.safety, entry.uses_code,
                entry.transitions_state, spec.description, entry.confirm, params_schema=spec.input_schema)


async def load_agent(path: Path | None) -> Agent:
    """The profile at `path` (None: the built-in demo agent) with its tools loaded and checked."""
    builtin = {t.tool_id for t in demo_tools()}
    profile = load_profile(path, known_tools=builtin) if path is not None else demo_profile(known_tools=builtin)
    source = path.name if path is not None else "demo.toml"
    search_path = (str(path.resolve().parent),) if path is not None else ()
    problems: list[str] = []
    functions = []
    for i, entry in enumerate(profile.tools):
        if entry.impl is None:
            continue
        try:
            load_tool(entry.id, entry.impl, search_path)
        except ToolLoadError as exc:
            problems.append(f"{source}: tools[{i}].impl: {exc}")
            continue
        functions.append((entry.id, entry.impl))
    mcp = []
    servers = profile.mcp_servers
    if servers:
        from actors.tools.mcp import McpError, discover
    found = await asyncio.gather(*(discover(server) for server in servers), return_exceptions=True)
    for server, specs in zip(servers, found, strict=True):
        if isinstance(specs, McpError):
            problems.append(f"{source}: {specs}")
        elif isinstance(specs, BaseException):
            problems.append(f"{source}: mcp_servers.{server.name}: {type(specs).__name__}: {specs}")
        else:
            mcp.append((server, tuple(specs)))
    if problems:
        raise ProfileError("\n".join(problems))
    sources = ToolSources(tuple(functions), search_path, tuple(mcp))
    return Agent(profile, build_registry(sources), sources)


@dataclass(frozen=True)
class Agents:
    """Several agents, loaded, in the order they were given: one registry holds all their tools."""

    agents: tuple[Agent, ...]
    registry: ToolRegistry
    sources: ToolSources

    @property
    def profiles(self) -> tuple[AgentProfile, ...]:
        return tuple(agent.profile for agent in self.agents)


def profile_paths(paths: Sequence[Path]) -> list[Path]:
    """Each path a profile, a directory standing for its `*.toml` files (by name); each file once."""
    found: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.glob("*.toml") if p.is_file())
            if not files:
                raise ProfileError(f"{path}: no agent profile (*.toml) in this directory")
        else:
            files = [path]
        for file in files:
            if file.resolve() not in seen:
                seen.add(file.resolve())
                found.append(file)
    return found


async def load_agents(paths: Sequence[Path]) -> Agents:
    """The profiles at `paths` (files, or directories of them; none: the built-in demo agent), each
    loaded as `load_agent` loads one, and their tools merged into one registry. Raises ProfileError:
    every problem of every profile, or what keeps two of them from being served together."""
    files = profile_paths(paths)
    clashes = module_clashes(files)  # before any import: the second module of a name would be the first one
    if clashes:
        raise ProfileError("\n".join(clashes))
    loaded: list[tuple[str, Agent]] = []
    problems: list[str] = []
    chosen: list[Path | None] = [*files] or [None]
    for file in chosen:
        try:
            loaded.append((str(file) if file is not None else "demo.toml", await load_agent(file)))
        except ProfileError as exc:
            problems.append(str(exc))
    if problems:
        raise ProfileError("\n".join(problems))
    names: dict[str, str] = {}
    for where, agent in loaded:
        other = names.setdefault(agent.profile.name, where)
        if other != where:
            problems.append(f"{other} and {where} both define the agent {agent.profile.name!r}: agent names must be unique")
    sources = _merged([(where, agent.sources) for where, agent in loaded], problems)
    if problems:
        raise ProfileError("\n".join(problems))
    return Agents(tuple(agent for _, agent in loaded), build_registry(sources), sources)


def module_clashes(files: Sequence[Path]) -> list[str]:
    """Python imports one module per name: two profiles whose `impl` modules of one name sit beside
    them in two directories would run the first one's tools for both. Read from the files alone,
    before anything is imported."""
    providers: dict[str, tuple[Path, Path]] = {}   # module name → (profile, the directory holding it)
    problems = []
    for file in files:
        try:
            tools = tomllib.loads(file.read_text(encoding="utf-8")).get("tools", [])
        except (OSError, ValueError):
            continue  # load_agent reports it, naming the file
        here = file.resolve().parent
        for entry in tools if isinstance(tools, list) else []:
            impl = entry.get("impl") if isinstance(entry, dict) else None
            top = impl.partition(":")[0].partition(".")[0] if isinstance(impl, str) else ""
            if not top or not ((here / f"{top}.py").is_file() or (here / top / "__init__.py").is_file()):
                continue
            first, where = providers.setdefault(top, (file, here))
            if where != here:
                problems.append(f"{first} and {file} each have a module {top!r} beside them, and one process "
                                f"imports one module of a name: rename one of them")
    return list(dict.fromkeys(problems))


def _merged(named: Sequence[tuple[str, ToolSources]], problems: list[str]) -> ToolSources:
    """One ToolSources for several agents; a tool id or an MCP server name two of them give different
    meanings is a problem naming both files."""
    functions: dict[str, tuple[str, str]] = {}                       # tool id → (impl, profile)
    servers: dict[str, tuple[McpServerConfig, tuple[McpToolSpec, ...], str]] = {}
    search_path: dict[str, None] = {}
    for where, sources in named:
        search_path.update(dict.fromkeys(sources.search_path))
        for tool_id, impl in sources.functions:
            first_impl, first = functions.setdefault(tool_id, (impl, where))
            if first_impl != impl:
                problems.append(f"{first} and {where} both define the tool {tool_id!r}, as {first_impl!r} and {impl!r}")
        for server, specs in sources.mcp:
            known = servers.setdefault(server.name, (server, specs, where))
            if (known[0], known[1]) != (server, specs):
                problems.append(f"{known[2]} and {where} both declare the MCP server {server.name!r}, differently")
    mcp_ids = {spec.tool_id: name for name, (_, specs, _) in servers.items() for spec in specs}
    for tool_id, (_, where) in functions.items():
        if tool_id in mcp_ids:
            problems.append(f"{where}: the tool {tool_id!r} is also a tool of the MCP server {mcp_ids[tool_id]!r} "
                            f"of {servers[mcp_ids[tool_id]][2]}")
    return ToolSources(
        tuple((tool_id, impl) for tool_id, (impl, _) in functions.items()),
        tuple(search_path),
        tuple((server, specs) for server, specs, _ in servers.values()),
    )
