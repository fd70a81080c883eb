"""The MCP server example of the docs (docs/examples/notes_server.py, docs/design.md#mcp-servers) is
an agent that works as written: its profile, docs/examples/notes.toml, loads through the loader
`serve` uses (actors/agent.py), which starts the server with `python` — the gateway's interpreter —
and every declared tool answers through the agent's own registry. No part of the SDK is mocked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from actors.agent import Agent, load_agent
from actors.catalog import Safety, Trait
from actors.tools.mcp import McpCallFailed, close_sessions
from actors.tools.registry import ToolContext

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "notes.toml"


@pytest.fixture
async def agent() -> AsyncIterator[Agent]:
    yield await load_agent(EXAMPLE)
    await close_sessions()


async def call(agent: Agent, tool_id: str, **params: Any) -> dict[str, Any]:
    tool = agent.registry.get(tool_id)
    model, violations = agent.registry.validate_params(tool_id, params)
    assert tool is not None and model is not None and violations == [], violations
    return await tool.handler(model, ToolContext(conversation_id="c1", turn_id="t1", call_id="k1"))


async def test_the_example_profile_loads_with_its_servers_tools_and_their_traits(agent: Agent) -> None:
    catalog = agent.registry.catalog()
    declared = {d.tool_id: (d.trait, d.safety) for d in catalog if d.tool_id.startswith("notes.")}
    assert declared == {
        "notes.read_note": (Trait.EXPLORATION, Safety.SAFE),
        "notes.list_notes": (Trait.EXPLORATION, Safety.SAFE),
        "notes.write_note": (Trait.EXPLOITATION, Safety.WRITE),
        "notes.delete_note": (Trait.EXPLOITATION, Safety.WRITE),
    }
    read = catalog.get("notes.read_note")
    assert read is not None and read.description == "Read the note stored under key."
    assert read.params_schema["required"] == ["key"]


async def test_the_example_tools_answer_with_their_results_as_objects(agent: Agent) -> None:
    assert await call(agent, "notes.write_note", key="shopping", text="milk") == {
        "key": "shopping", "replaced": False, "count": 1}                     # a bare dict: read back from its JSON
    assert await call(agent, "notes.read_note", key="shopping") == {"key": "shopping", "text": "milk"}
    assert await call(agent, "notes.list_notes") == {"result": ["shopping"]}   # a list: wrapped
    assert await call(agent, "notes.delete_note", key="shopping") == {"key": "shopping", "deleted": True}
    with pytest.raises(McpCallFailed, match=r"^notes\.read_note: Error executing tool read_note: no note 'shopping'$"):
        await call(agent, "notes.read_note", key="shopping")


async def test_a_call_the_servers_schema_refuses_is_a_violation(agent: Agent) -> None:
    assert agent.registry.validate_params("notes.write_note", {"key": "k"})[1] != []


def test_the_server_shown_in_the_design_doc_is_the_example_file_abridged() -> None:
    design = (EXAMPLE.parent.parent / "design.md").read_text(encoding="utf-8")
    shown = design.split("# notes_server.py, next to the profile (mcp 2.x)\n", 1)[1].split("```", 1)[0]
    source = {line.split("  #")[0].rstrip() for line in (EXAMPLE.parent / "notes_server.py").read_text().splitlines()}
    missing = [line for line in shown.splitlines() if line.split("  #")[0].rstrip() not in source]
    assert missing == []
