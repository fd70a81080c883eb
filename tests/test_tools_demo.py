"""The demo tools of docs/design.md#demo-tools, called through their registry entry (params model + handler)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from actors.catalog import ASK_USER_TOOL, Safety, Trait
from actors.tools.arith import ArithError, evaluate
from actors.tools.demo import FIXED_INSTANT, demo_registry, fixed_clock, iso_utc
from actors.tools.registry import ToolContext, utc_now

REGISTRY = demo_registry()

# docs/design.md#demo-tools, as written there: tool_id → (trait, safety).
DOCUMENTED_TABLE = {
    "demo.search": (Trait.EXPLORATION, Safety.SAFE),
    "demo.weather": (Trait.EXPLORATION, Safety.SAFE),
    "demo.render": (Trait.EXPLOITATION, Safety.SAFE),
    "demo.write_note": (Trait.EXPLOITATION, Safety.WRITE),
    "demo.clock": (Trait.NEUTRAL, Safety.SAFE),
    "demo.sleep": (Trait.NEUTRAL, Safety.SAFE),
    "demo.fail": (Trait.NEUTRAL, Safety.SAFE),
    "demo.eval": (Trait.EXPLOITATION, Safety.SAFE),
    "demo.focus_project": (Trait.NEUTRAL, Safety.SAFE),
    "demo.open_tab": (Trait.NEUTRAL, Safety.SAFE),
    "react.ask_user": (Trait.NEUTRAL, Safety.SAFE),
}


def ctx(code: str | None = None, workspace: dict[str, Any] | None = None) -> ToolContext:
    workspace = {} if workspace is None else workspace
    return ToolContext("conv", "turn", "call", code=code, workspace=workspace, clock=fixed_clock())


async def run(tool_id: str, params: dict[str, Any], context: ToolContext | None = None) -> dict[str, Any]:
    model, violations = REGISTRY.validate_params(tool_id, params)
    assert model is not None, violations
    tool = REGISTRY.get(tool_id)
    assert tool is not None
    return await tool.handler(model, context or ctx())


# --- declarations ------------------------------------------------------------------------


def test_demo_catalog_matches_spec_table() -> None:
    catalog = REGISTRY.catalog()
    assert {d.tool_id: (d.trait, d.safety) for d in catalog} == DOCUMENTED_TABLE


def test_only_eval_uses_code() -> None:
    assert [d.tool_id for d in REGISTRY.catalog() if d.uses_code] == ["demo.eval"]


def test_only_focus_project_transitions_state() -> None:
    assert [d.tool_id for d in REGISTRY.catalog() if d.transitions_state] == ["demo.focus_project"]


def test_params_schema_is_the_params_model_json_schema() -> None:
    decl = REGISTRY.catalog().get("demo.render")
    assert decl is not None
    assert decl.params_schema["properties"]["format"]["enum"] == ["pdf", "pptx"]
    assert decl.params_schema["additionalProperties"] is False


def test_every_demo_tool_has_a_description() -> None:
    assert all(d.description for d in REGISTRY.catalog())


# --- params validation -------------------------------------------------------------------


def test_unknown_param_is_a_violation_naming_it() -> None:
    model, violations = REGISTRY.validate_params("demo.search", {"query": "x", "lang": "fr"})
    assert model is None
    assert violations == ["lang: unknown parameter"]


def test_violation_names_field_without_echoing_value() -> None:
    secret = "docx-SECRET-VALUE"
    model, violations = REGISTRY.validate_params("demo.render", {"source": "a", "format": secret})
    assert model is None
    assert len(violations) == 1 and violations[0].startswith("format:")
    assert secret not in violations[0]


def test_missing_param_is_named() -> None:
    _, violations = REGISTRY.validate_params("demo.weather", {})
    assert violations == ["city: Field required"]


def test_validate_params_of_unknown_tool() -> None:
    assert REGISTRY.validate_params("demo.nope", {}) == (None, ["unknown tool"])


# --- behaviour ---------------------------------------------------------------------------


async def test_search_paris_weather_ranks_paris_weather_first() -> None:
    result = await run("demo.search", {"query": "paris weather"})
    assert result["results"][0]["id"] == "weather-paris"


async def test_search_is_deterministic() -> None:
    assert await run("demo.search", {"query": "Paris"}) == await run("demo.search", {"query": "Paris"})


async def test_search_without_match_returns_no_results() -> None:
    assert await run("demo.search", {"query": "zzzz"}) == {"results": []}


async def test_weather_paris_is_the_spec_row() -> None:
    assert await run("demo.weather", {"city": "Paris"}) == {"city": "Paris", "condition": "rain", "temp_c": 12}


async def test_weather_city_lookup_ignores_case_and_spacing() -> None:
    assert (await run("demo.weather", {"city": "  new   YORK "}))["city"] == "New York"


async def test_weather_unknown_city_raises_clear_error() -> None:
    with pytest.raises(LookupError, match="known cities: Paris"):
        await run("demo.weather", {"city": "Atlantis"})


async def test_render_names_artifact_after_source_and_format() -> None:
    assert await run("demo.render", {"source": "report", "format": "pptx"}) == {"artifact": "report.pptx"}


async def test_write_note_appends_to_workspace_and_counts() -> None:
    workspace: dict[str, Any] = {}
    await run("demo.write_note", {"text": "one"}, ctx(workspace=workspace))
    result = await run("demo.write_note", {"text": "two"}, ctx(workspace=workspace))
    assert result == {"stored": True, "count": 2}
    assert workspace == {"notes": ["one", "two"]}


async def test_clock_reports_injected_clock_as_iso_utc() -> None:
    assert await run("demo.clock", {}) == {"now": "2026-01-01T00:00:00Z"}


def test_default_clock_is_real_utc_time() -> None:
    now = utc_now()
    assert now.tzinfo is UTC and now > FIXED_INSTANT


def test_iso_utc_takes_naive_datetimes_as_utc() -> None:
    assert iso_utc(datetime(2026, 1, 1, 12, 30)) == "2026-01-01T12:30:00Z"


async def test_sleep_returns_seconds_slept() -> None:
    assert await run("demo.sleep", {"seconds": 0}) == {"slept_s": 0.0}


@pytest.mark.parametrize("seconds", [-1, 3601])
def test_sleep_seconds_bounded(seconds: float) -> None:
    model, violations = REGISTRY.validate_params("demo.sleep", {"seconds": seconds})
    assert model is None and violations[0].startswith("seconds:")


async def test_fail_raises_runtime_error_with_message() -> None:
    with pytest.raises(RuntimeError, match=r"^boom$"):
        await run("demo.fail", {"message": "boom"})


async def test_eval_evaluates_code_channel() -> None:
    assert await run("demo.eval", {}, ctx(code="(2 + 3) * 4 - 10 / 4")) == {"value": 17.5}


async def test_eval_without_code_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="code channel"):
        await run("demo.eval", {}, ctx(code="  "))


async def test_focus_project_reports_focused_state() -> None:
    assert await run("demo.focus_project", {"name": "apollo"}) == {"project": "apollo", "state": "focused"}


async def test_open_tab_returns_ui_command() -> None:
    result = await run("demo.open_tab", {"name": "docs"})
    assert result["ui_commands"] == [{"command": "open_tab", "args": {"name": "docs"}}]


def test_ask_user_options_are_optional() -> None:
    model, violations = REGISTRY.validate_params(ASK_USER_TOOL, {"question": "Go on?"})
    assert model is not None and not violations


async def test_ask_user_handler_refuses_to_run() -> None:
    with pytest.raises(RuntimeError, match="never be executed"):
        await run(ASK_USER_TOOL, {"question": "Go on?", "options": ["yes", "no"]})


# --- the arithmetic evaluator ------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 // 2", 3),
        ("7 % 4", 3),
        ("2 ** 10", 1024),
        ("-3 + +2", -1),
        ("1.5 * 2", 3.0),
        ("2 ** -1", 0.5),
    ],
)
def test_eval_computes_allowed_arithmetic(source: str, value: float) -> None:
    assert evaluate(source) == value


@pytest.mark.parametrize(
    ("source", "construct"),
    [
        ("x + 1", "names"),
        ("abs(-1)", "function calls"),
        ("__import__('os').system('true')", "function calls"),
        ("(1).real", "attribute access"),
        ("[1][0]", "subscripts"),
        ("1 < 2", "comparisons"),
        ("1 | 2", "the operator BitOr"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
    ],
)
def test_eval_rejects_anything_but_arithmetic(source: str, construct: str) -> None:
    with pytest.raises(ArithError, match=construct):
        evaluate(source)


def test_eval_rejects_statements() -> None:
    with pytest.raises(ArithError, match="not an arithmetic expression"):
        evaluate("import os")


def test_eval_division_by_zero_is_clear() -> None:
    with pytest.raises(ArithError, match="division by zero"):
        evaluate("1 / (2 - 2)")


def test_eval_refuses_huge_powers_before_computing() -> None:
    with pytest.raises(ArithError, match="too large"):
        evaluate("9 ** 9 ** 9")


def test_eval_refuses_non_finite_results() -> None:
    with pytest.raises(ArithError):
        evaluate("1e308 * 10")


@pytest.mark.parametrize("source", ["(" * 4000 + "1" + ")" * 4000, "-" * 9000 + "1", "1" + "+1" * 4000])
def test_eval_refuses_deep_nesting_cleanly(source: str) -> None:
    with pytest.raises(ArithError):
        evaluate(source)
