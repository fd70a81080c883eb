"""`reactgate agent check PROFILE.toml…`: load a profile exactly as `serve` does — tools imported, MCP
servers started and asked for their tools — and show what its gates will see, per state
(docs/design.md#your-own-agent).

Exit 0 with a table per state, or 2 with every problem found, each naming the profile and the field.
Several profiles (or directories of them) are each checked, and then together as `serve` would
serve them (docs/design.md#several-agents); exit 2 if any fails.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from actors.catalog import Safety
from protocol.native import function_name

EXIT_OK = 0
EXIT_PROBLEMS = 2


def tool_rows(agent: Any) -> list[dict[str, Any]]:
    """One row per tool of the agent, as its conversations will see them."""
    profile = agent.profile
    catalog = profile.catalog_from(agent.registry.catalog())
    sources = {entry.id: f"python {entry.impl}" for entry in profile.tools if entry.impl is not None}
    for server in profile.mcp_servers:
        for name in server.tools:
            sources[server.tool_id(name)] = f"mcp {server.name}"
    rows = []
    for decl in catalog:
        rows.append({
            "id": decl.tool_id,
            "source": sources.get(decl.tool_id, "built-in"),
            "trait": str(decl.trait),
            "safety": str(decl.safety),
            "uses_code": decl.uses_code,
            "transitions_state": decl.transitions_state,
            "states": sorted(decl.states) if decl.states is not None else list(profile.states),
            "hidden_in_ask_mode": decl.safety == Safety.WRITE,
        })
    return rows


def check(paths: Path | Sequence[Path], as_json: bool = False) -> int:
    """Check each profile; with several, also whether they can be served together. One profile's
    --json is one object; several's, a list of them (then `together` if that failed)."""
    from actors.agent import load_agents, module_clashes, profile_paths
    from actors.profile import ProfileError

    try:
        files = profile_paths([paths] if isinstance(paths, Path) else paths)
    except ProfileError as exc:
        return _problems("profiles", str(exc).splitlines(), as_json)
    if len(files) == 1:
        return _check(files[0], as_json)
    reports: list[dict[str, Any]] = []
    clashes = module_clashes(files)
    if clashes:  # importing them one after the other would check the wrong module
        code = _problems("together", clashes, as_json, reports)
        if as_json:
            print(json.dumps(reports, indent=2))
        return code
    codes = [_check(path, as_json, reports) for path in files]
    if EXIT_PROBLEMS not in codes:
        try:
            asyncio.run(load_agents(files))
        except ProfileError as exc:  # each is fine alone: two agents' names, tools or modules collide
            codes.append(_problems("together", str(exc).splitlines(), as_json, reports))
    if as_json:
        print(json.dumps(reports, indent=2))
    return EXIT_PROBLEMS if EXIT_PROBLEMS in codes else EXIT_OK


def _problems(where: str, problems: list[str], as_json: bool, reports: list[dict[str, Any]] | None = None) -> int:
    if as_json:
        report = {"ok": False, "profile": where, "problems": problems}
        if reports is None:
            print(json.dumps(report, indent=2))
        else:
            reports.append(report)
    else:
        print(f"{where}: {len(problems)} problem(s)", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
    return EXIT_PROBLEMS


def _check(path: Path, as_json: bool = False, reports: list[dict[str, Any]] | None = None) -> int:
    from actors.agent import load_agent
    from actors.profile import ProfileError

    try:
        agent = asyncio.run(load_agent(path))
    except ProfileError as exc:
        return _problems(str(path), str(exc).splitlines(), as_json, reports)
    rows = tool_rows(agent)
    profile = agent.profile
    if as_json:
        report = {"ok": True, "profile": str(path), "agent": profile.name, "model": profile.model,
                  "decision": profile.decision, "fallbacks": list(profile.fallbacks),
                  "states": list(profile.states), "tools": rows}
        if reports is None:
            print(json.dumps(report, indent=2))
        else:
            reports.append(report)
        return EXIT_OK
    _print_tables(path, profile, rows)
    return EXIT_OK


DECISION_NAMES = {"channels": "channels (channel-tagged text)", "native": "native (the model's function calling)"}


def _print_tables(path: Path, profile: Any, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)  # piped: whole lines, not a folded table
    console.print(f"[bold]{profile.name}[/bold] ({path}): model {profile.model}"
                  + (f", fallbacks {', '.join(profile.fallbacks)}" if profile.fallbacks else "")
                  + f"; decision protocol: {DECISION_NAMES[profile.decision]}")
    native = profile.decision == "native"
    for state in profile.states:
        table = Table(title=f"state {state!r}" + (" (initial)" if state == profile.initial_state else ""))
        for column in ("tool", *(("function",) if native else ()), "source", "trait", "safety", "uses_code",
                       "transitions_state", "ask mode"):
            table.add_column(column)
        for row in rows:
            if state not in row["states"]:
                continue
            table.add_row(row["id"], *((function_name(row["id"]),) if native else ()), row["source"], row["trait"], row["safety"],
                          "yes" if row["uses_code"] else "", "yes" if row["transitions_state"] else "",
                          "hidden" if row["hidden_in_ask_mode"] else "offered")
        console.print(table)
