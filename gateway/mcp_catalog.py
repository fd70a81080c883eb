"""The MCP face's catalog (docs/design.md#mcp-face): what `tools/list` shows and what
`search_capabilities` finds, from the tools the gates would allow the session now. Sans-I/O: a view
in, MCP tool descriptions out.

The catalog is never a second opinion on the rules: it lists exactly `ExternalView.tools`, the
tools available in the conversation's state under the session's mode (actors/external_call.py), so
a tool the client sees is one the gates let through, and a write tool in observe is nowhere.
Past the profile's `catalog_max` (`[mcp_face]`), the list is compact: the core tools and one
`search_capabilities` tool, which returns stable ids, schemas, a policy digest and a read or write
route, and runs nothing itself. A tool found by search is called by its id like a listed one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from actors.catalog import ASK_USER_TOOL, Safety, ToolDecl
from actors.external_call import ExternalView

SEARCH_TOOL: Final = "search_capabilities"
SEARCH_LIMIT: Final = 8
SEARCH_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1, "description": "what the capability should do"}},
    "required": ["query"],
    "additionalProperties": False,
}
SEARCH_DESCRIPTION: Final = (
    "Find more of this agent's tools by what they do. Returns each match's id (call it by that name), its "
    "input schema, a digest of its schema and policy, and its route (read or write). Runs nothing itself."
)
META_KEY: Final = "reactgate/policy"   # each listed tool's trait, safety, confirm and digest, in its `_meta`


@dataclass(frozen=True, slots=True)
class Listed:
    """What one `tools/list` answered: the tools, and the digest a later change is told by."""

    tools: list[dict[str, Any]]
    digest: str


def route(decl: ToolDecl) -> str:
    """`write` for a tool that acts (absent in observe), else `read`."""
    return "write" if decl.safety is Safety.WRITE else "read"


def policy_digest(decl: ToolDecl) -> str:
    """12 hex digits over the tool's schema and everything the rules decide it by: the same tool under
    the same policy keeps its digest, and a change of either changes it."""
    facts = {"id": decl.tool_id, "schema": decl.params_schema, "trait": str(decl.trait), "safety": str(decl.safety),
             "confirm": decl.confirm, "transitions_state": decl.transitions_state,
             "states": sorted(decl.states) if decl.states is not None else None}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def describe(decl: ToolDecl) -> dict[str, Any]:
    """One tool as MCP's `Tool` (wire names): its id as the name, its params schema, hints and policy."""
    return {
        "name": decl.tool_id,
        "description": decl.description or decl.tool_id,
        "inputSchema": _object_schema(decl.params_schema),
        "annotations": {"readOnlyHint": decl.safety is not Safety.WRITE},
        "_meta": {META_KEY: {"trait": str(decl.trait), "safety": str(decl.safety), "confirm": decl.confirm,
                             "digest": policy_digest(decl), "route": route(decl)}},
    }


def listing(view: ExternalView) -> Listed:
    """`tools/list`: every tool available now, or past `catalog_max` the core tools (`react.ask_user`
    and the profile's `core_tools`) and `search_capabilities`."""
    tools = list(view.tools)
    if len(tools) > view.catalog_max:
        core = {ASK_USER_TOOL, *view.core_tools}
        shown = [describe(d) for d in tools if d.tool_id in core]
        shown.append({"name": SEARCH_TOOL, "description": SEARCH_DESCRIPTION, "inputSchema": dict(SEARCH_SCHEMA),
                      "annotations": {"readOnlyHint": True}})
    else:
        shown = [describe(d) for d in tools]
    return Listed(shown, catalog_digest(view))


def catalog_digest(view: ExternalView) -> str:
    """What the session may call now, as one digest: `notifications/tools/list_changed` is sent when it
    differs from the one the client was last listed."""
    parts = sorted(f"{d.tool_id}:{policy_digest(d)}" for d in view.tools)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def search(view: ExternalView, query: str, limit: int = SEARCH_LIMIT) -> list[dict[str, Any]]:
    """The tools available now that match `query` best (words of the id and description in common),
    each with its id, description, input schema, policy digest and route. Nothing is run."""
    wanted = _words(query)
    scored = sorted(((len(wanted & _words(f"{d.tool_id} {d.description}")), d) for d in view.tools),
                    key=lambda pair: (-pair[0], pair[1].tool_id))
    return [{"id": d.tool_id, "description": d.description, "inputSchema": _object_schema(d.params_schema),
             "digest": policy_digest(d), "route": route(d), "trait": str(d.trait), "confirm": d.confirm}
            for score, d in scored[:limit] if score > 0]


def _words(text: str) -> set[str]:
    return {w for w in re.split(r"[^a-z0-9]+", text.lower()) if len(w) > 1}


def _object_schema(schema: Mapping[str, Any] | Iterable[Any]) -> dict[str, Any]:
    """MCP wants an object schema; a tool without params has an empty one."""
    out = dict(schema) if isinstance(schema, Mapping) else {}
    out.setdefault("type", "object")
    return out
