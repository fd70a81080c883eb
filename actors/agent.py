"""An agent, loaded: its profile and the tools it runs (docs/design.md#your-own-agent).

`load_agent` is what `reactgate serve` and `reactgate agent check` both call, so a profile that
check accepts is one serve accepts. It imports every `impl` and starts every MCP server once, at
start-up: a missing module, a non-tool attribute, an undeclared MCP tool or a server that does
not come up is a `ProfileError` naming the profile and the field, never a crash later on a host.

The registry it returns rebuilds itself in any process it is pickled into (a ConversationHost, the
tool pool): it carries its `ToolSources` — the `impl` strings, the directories to import them from
and the MCP tools discovered here — not the tools, so every runtime that runs tools loads the same
tools, and no MCP server is asked again.
"""

from __future__ import annotations

import asyncio
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
