"""`reactgate agent check PROFILE.toml…`: load a profile exactly as `serve` does — tools imported, MCP
servers started and asked for their tools — and show what its gates will see, per state
(docs/design.md#agent-check).

Exit 0 with a table per state, or 2 with every problem found, each naming the profile and the field.
Warnings — what would make every call of a model fail, or a setting its provider does not take — are
printed and listed in `--json`, and leave the exit code alone. `--probe` calls each model once,
through `stream_model` as a turn would, and says what came back; exit 1 when a model failed.
Several profiles (or directories of them) are each checked, then together as `serve` would serve
them (docs/design.md#several-agents); the worst exit code of them all.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from pathlib import Path
from typing import Any, Final

from actors.catalog import Safety
from protocol.native import function_name

EXIT_OK = 0
EXIT_PROBE_FAILED = 1
EXIT_PROBLEMS = 2

PROBE_MESSAGES: Final = ({"role": "user", "content": "Say hello in a few words."},)
PROBE_MAX_TOKENS: Final = 16     # a probe asks for little: the call, not the answer, is what is checked
PROBE_TIMEOUT_S: Final = 30.0
PROBE_CHARS: Final = 40          # the first characters of the answer, shown


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


def model_warnings(profile: Any, source: str, environ: Mapping[str, str]) -> list[str]:
    """What would make a model's calls fail, or go out unchecked, each naming the profile and the
    field: a key variable not set here, a model string with no provider LiteLLM knows, a setting that
    neither reactgate, LiteLLM nor the model's provider takes (docs/design.md#agent-check)."""
    from actors.llm.providers import no_provider, provider_of, unknown_settings

    out = []
    for i, model in enumerate(profile.models):
        field = "model" if i == 0 else f"fallbacks[{i - 1}]"
        settings_field = "model_settings" if model == profile.model else f'fallback_settings."{model}"'
        settings = profile.settings_for(model)
        api_base = settings.get("api_base")
        provider = provider_of(model, api_base)
        if provider is None:
            out.append(f"{source}: {field}: {no_provider(model)}")
        variable = settings.get("api_key_env")
        if variable and not environ.get(variable):
            out.append(f"{source}: {settings_field}.api_key_env: the variable {variable} is not set here: every call "
                       f"of {model!r} fails with auth in a process that does not have it")
        for key in unknown_settings(model, settings, api_base):
            out.append(f"{source}: {settings_field}.{key}: LiteLLM knows no parameter {key!r} for provider "
                       f"{provider!r} (model {model!r}): it would be sent to the provider unchecked")
    return out


async def probe(model: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One minimal call of `model` through `stream_model`, as a turn makes it: ok with the first
    characters of the answer, or the error's kind and (scrubbed) message."""
    from actors.llm.stream import ModelDelta, ProviderError, stream_model

    text = ""
    calls = itertools.count()
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            items = stream_model([model], [dict(m) for m in PROBE_MESSAGES], conversation_id="agent-check-probe",
                                 next_call_index=calls.__next__, settings={model: settings},
                                 max_tokens=PROBE_MAX_TOKENS, timeout_s=PROBE_TIMEOUT_S, idle_timeout_s=PROBE_TIMEOUT_S)
            async with aclosing(items):
                async for item in items:
                    if type(item) is ModelDelta:
                        text += item.text
                        if len(text) >= PROBE_CHARS:
                            break   # enough to show: closing the stream ends the generation
    except ProviderError as exc:
        return {"model": model, "ok": False, "kind": exc.kind, "message": exc.detail}
    except TimeoutError:
        return {"model": model, "ok": False, "kind": "timeout", "message": f"no answer within {PROBE_TIMEOUT_S:g} s"}
    return {"model": model, "ok": True, "text": text[:PROBE_CHARS]}


async def probe_all(profile: Any) -> list[dict[str, Any]]:
    # The probe's own line says what failed: the failure log's line (actors/llm/failures.py) would repeat it.
    logging.getLogger("reactgate.llm").addHandler(logging.NullHandler())
    return [await probe(model, profile.settings_for(model)) for model in profile.models]


def probe_line(result: Mapping[str, Any]) -> str:
    if result["ok"]:
        answered = f"it answered {result['text']!r}" if result["text"] else "it answered with no text"
        return f"probe {result['model']}: ok, {answered}"
    return f"probe {result['model']}: failed: {result['kind']}: {result['message']}"


def check(paths: Path | Sequence[Path], as_json: bool = False, *, run_probe: bool = False,
          environ: Mapping[str, str] | None = None) -> int:
    """Check each profile; with several, also whether they can be served together. One profile's
    --json is one object; several's, a list of them (then `together` if that failed)."""
    from actors.agent import load_agents, module_clashes, profile_paths
    from actors.profile import ProfileError

    try:
        files = profile_paths([paths] if isinstance(paths, Path) else paths)
    except ProfileError as exc:
        return _problems("profiles", str(exc).splitlines(), as_json)
    if len(files) == 1:
        return _check(files[0], as_json, run_probe=run_probe, environ=environ)
    reports: list[dict[str, Any]] = []
    clashes = module_clashes(files)
    if clashes:  # importing them one after the other would check the wrong module
        codes = [_problems("together", clashes, as_json, reports)]
    else:
        codes = [_check(path, as_json, run_probe=run_probe, environ=environ, reports=reports) for path in files]
        if EXIT_PROBLEMS not in codes:
            try:
                asyncio.run(load_agents(files))
            except ProfileError as exc:  # each is fine alone: two agents' names, tools or modules collide
                codes.append(_problems("together", str(exc).splitlines(), as_json, reports))
    if as_json:
        print(json.dumps(reports, indent=2))
    return max(codes)  # EXIT_PROBLEMS over EXIT_PROBE_FAILED over EXIT_OK


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


def _check(path: Path, as_json: bool = False, *, run_probe: bool = False,
           environ: Mapping[str, str] | None = None, reports: list[dict[str, Any]] | None = None) -> int:
    from actors.agent import load_agent
    from actors.profile import ProfileError

    try:
        agent = asyncio.run(load_agent(path))
    except ProfileError as exc:
        return _problems(str(path), str(exc).splitlines(), as_json, reports)
    rows = tool_rows(agent)
    profile = agent.profile
    warnings = model_warnings(profile, path.name, os.environ if environ is None else environ)
    probes = asyncio.run(probe_all(profile)) if run_probe else []
    status = EXIT_PROBE_FAILED if any(not p["ok"] for p in probes) else EXIT_OK
    if as_json:
        report = {"ok": True, "profile": str(path), "agent": profile.name, "model": profile.model,
                  "decision": profile.decision, "fallbacks": list(profile.fallbacks),
                  "states": list(profile.states), "tools": rows, "warnings": warnings,
                  **({"probes": probes} if run_probe else {})}
        if reports is None:
            print(json.dumps(report, indent=2))
        else:
            reports.append(report)
        return status
    _print_tables(path, profile, rows)
    if warnings:
        print(f"{path}: {len(warnings)} warning(s)", file=sys.stderr)
        for line in warnings:
            print(f"  {line}", file=sys.stderr)
    for result in probes:
        print(probe_line(result))
    return status


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
