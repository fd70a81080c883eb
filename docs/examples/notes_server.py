"""A complete MCP server for a reactgate agent: notes, kept while the server runs.

The agent's profile, `notes.toml` next to this file, starts it over stdio as
`command = ["python", "notes_server.py"]` — `python` there is the gateway's own interpreter, so the
`mcp` SDK (2.x) the gateway has is the one this imports (docs/design.md#mcp-servers). Try it with
`reactgate agent check docs/examples/notes.toml`.

What a tool returns is what the model observes: a dict is the observation as it is (with a
`-> dict[str, Any]` annotation the SDK sends it as `structuredContent`; reactgate reads a bare
`-> dict` back from its JSON text too); any other value is `{"result": value}`. A `ToolError` is a
failed observation carrying its text.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

srv = MCPServer("notes", log_level="WARNING")
NOTES: dict[str, str] = {}


@srv.tool()
def read_note(key: str) -> dict[str, Any]:
    """Read the note stored under key."""
    if key not in NOTES:
        raise ToolError(f"no note {key!r}")
    return {"key": key, "text": NOTES[key]}


@srv.tool()
def list_notes() -> list[str]:
    """The keys of every note, in order."""
    return sorted(NOTES)


@srv.tool()
def write_note(key: str, text: str) -> dict:  # a bare dict: no output schema, sent as JSON text
    """Store a note under key, replacing any note already there."""
    replaced = key in NOTES
    NOTES[key] = text
    return {"key": key, "replaced": replaced, "count": len(NOTES)}


@srv.tool()
def delete_note(key: str) -> dict[str, Any]:
    """Delete the note stored under key."""
    return {"key": key, "deleted": NOTES.pop(key, None) is not None}


if __name__ == "__main__":
    srv.run("stdio")
