"""The built-in demo tools (docs/design.md#demo-tools): deterministic, no network, one per rule they exercise.

Clock: `demo.clock` reads `ToolContext.clock`, whose default is the real UTC time. Tests and
scripted demos that need a fixed timestamp inject `fixed_clock()` (2026-01-01T00:00:00Z) through
`LocalToolExecutor(clock=...)`.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field

from actors.catalog import ASK_USER_TOOL, Safety, Trait
from actors.tools.arith import evaluate
from actors.tools.registry import Clock, Params, Tool, ToolContext, ToolRegistry

FIXED_INSTANT = datetime(2026, 1, 1, tzinfo=UTC)


def fixed_clock(at: datetime = FIXED_INSTANT) -> Clock:
    return lambda: at


def iso_utc(moment: datetime) -> str:
    """`2026-01-01T00:00:00Z`; a naive datetime is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


# --- demo.search ---------------------------------------------------------------------------

SEARCH_LIMIT = 5

CORPUS: tuple[dict[str, str], ...] = (
    {"id": "weather-paris", "title": "Paris weather today",
     "snippet": "Rain over Paris all day, 12 °C, light wind from the west."},
    {"id": "weather-london", "title": "London weather today",
     "snippet": "Cloudy in London with bright spells, 9 °C."},
    {"id": "weather-tokyo", "title": "Tokyo weather today",
     "snippet": "Sunny and mild in Tokyo, 18 °C."},
    {"id": "paris-guide", "title": "A weekend in Paris",
     "snippet": "Museums, cafés and walks along the Seine: a short Paris itinerary."},
    {"id": "eiffel-tower", "title": "Eiffel Tower opening hours",
     "snippet": "The Eiffel Tower in Paris opens at 9:30 every day of the year."},
    {"id": "python-asyncio", "title": "Python asyncio basics",
     "snippet": "Coroutines, tasks and event loops: concurrency in Python with asyncio."},
    {"id": "ray-actors", "title": "Ray actors",
     "snippet": "A Ray actor is a stateful worker process; methods run one at a time by default."},
    {"id": "websockets", "title": "WebSocket protocol overview",
     "snippet": "WebSockets give a full-duplex channel between browser and server over one TCP connection."},
    {"id": "react-pattern", "title": "The ReAct agent pattern",
     "snippet": "Reason and act: a model alternates thoughts, tool calls and observations."},
    {"id": "quarterly-report", "title": "Quarterly report template",
     "snippet": "Sections for revenue, costs and outlook; render it to pdf or pptx."},
    {"id": "berlin-transit", "title": "Berlin public transit",
     "snippet": "U-Bahn and S-Bahn lines cover Berlin; a day ticket covers zones A and B."},
    {"id": "sourdough", "title": "Sourdough bread recipe",
     "snippet": "Flour, water, salt and a mature starter; bake at 250 °C."},
)

_WORD = re.compile(r"\w+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class SearchParams(Params):
    query: str = Field(min_length=1, max_length=500, description="what to look for")


async def search(params: SearchParams, ctx: ToolContext) -> dict[str, Any]:
    # Ranked by the number of query words an entry contains, ties in corpus order: deterministic.
    wanted = _words(params.query)
    scored = []
    for index, entry in enumerate(CORPUS):
        score = len(wanted & _words(entry["title"] + " " + entry["snippet"]))
        if score:
            scored.append((-score, index, entry))
    scored.sort(key=lambda item: (item[0], item[1]))
    return {"results": [dict(entry) for _, _, entry in scored[:SEARCH_LIMIT]]}


# --- demo.weather --------------------------------------------------------------------------

WEATHER: dict[str, dict[str, Any]] = {
    "paris": {"city": "Paris", "condition": "rain", "temp_c": 12},
    "london": {"city": "London", "condition": "cloudy", "temp_c": 9},
    "berlin": {"city": "Berlin", "condition": "snow", "temp_c": -2},
    "tokyo": {"city": "Tokyo", "condition": "sunny", "temp_c": 18},
    "new york": {"city": "New York", "condition": "windy", "temp_c": 5},
    "madrid": {"city": "Madrid", "condition": "sunny", "temp_c": 21},
}


class WeatherParams(Params):
    city: str = Field(min_length=1, max_length=100)


async def weather(params: WeatherParams, ctx: ToolContext) -> dict[str, Any]:
    row = WEATHER.get(" ".join(params.city.lower().split()))
    if row is None:
        known = ", ".join(r["city"] for r in WEATHER.values())
        raise LookupError(f"no weather data for that city; known cities: {known}")
    return dict(row)


# --- demo.render ---------------------------------------------------------------------------


class RenderParams(Params):
    source: str = Field(min_length=1, max_length=200)
    format: Literal["pdf", "pptx"]


async def render(params: RenderParams, ctx: ToolContext) -> dict[str, Any]:
    return {"artifact": f"{params.source}.{params.format}"}


# --- demo.write_note -----------------------------------------------------------------------


class WriteNoteParams(Params):
    text: str = Field(min_length=1, max_length=10_000)


async def write_note(params: WriteNoteParams, ctx: ToolContext) -> dict[str, Any]:
    notes: list[str] = ctx.workspace.setdefault("notes", [])
    notes.append(params.text)
    return {"stored": True, "count": len(notes)}


# --- demo.clock, demo.sleep, demo.fail ------------------------------------------------------


class NoParams(Params):
    pass


async def clock(params: NoParams, ctx: ToolContext) -> dict[str, Any]:
    return {"now": iso_utc(ctx.clock())}


class SleepParams(Params):
    seconds: float = Field(ge=0, le=3600)


async def sleep(params: SleepParams, ctx: ToolContext) -> dict[str, Any]:
    await asyncio.sleep(params.seconds)
    return {"slept_s": params.seconds}


class FailParams(Params):
    message: str = Field(max_length=1_000)


async def fail(params: FailParams, ctx: ToolContext) -> dict[str, Any]:
    raise RuntimeError(params.message)


# --- demo.eval -----------------------------------------------------------------------------


async def eval_code(params: NoParams, ctx: ToolContext) -> dict[str, Any]:
    if ctx.code is None or not ctx.code.strip():
        raise ValueError("demo.eval evaluates the arithmetic in the code channel, which is empty")
    return {"value": evaluate(ctx.code)}


# --- demo.focus_project, demo.open_tab -----------------------------------------------------


class NameParams(Params):
    name: str = Field(min_length=1, max_length=200)


async def focus_project(params: NameParams, ctx: ToolContext) -> dict[str, Any]:
    return {"project": params.name, "state": "focused"}


async def open_tab(params: NameParams, ctx: ToolContext) -> dict[str, Any]:
    return {
        "opened": params.name,
        "ui_commands": [{"command": "open_tab", "args": {"name": params.name}}],
    }


# --- react.ask_user ------------------------------------------------------------------------


class AskUserParams(Params):
    question: str = Field(min_length=1, max_length=2_000)
    options: list[str] | None = None


async def ask_user(params: AskUserParams, ctx: ToolContext) -> dict[str, Any]:
    # The turn intercepts react.ask_user and pauses (docs/design.md#ask-user); reaching here is a routing bug.
    raise RuntimeError("react.ask_user is handled by the turn and must never be executed")


# --- the registry --------------------------------------------------------------------------


def demo_tools() -> list[Tool[Any]]:
    E, X, N = Trait.EXPLORATION, Trait.EXPLOITATION, Trait.NEUTRAL
    return [
        Tool("demo.search", SearchParams, search, E,
             description="Search a small built-in corpus; returns up to 5 ranked results."),
        Tool("demo.weather", WeatherParams, weather, E,
             description="Current weather for a city from a fixed table (e.g. Paris)."),
        Tool("demo.render", RenderParams, render, X,
             description="Render a source document to pdf or pptx; returns the artifact name."),
        Tool("demo.write_note", WriteNoteParams, write_note, X, Safety.WRITE,
             description="Store a note in the conversation workspace; returns the note count."),
        Tool("demo.clock", NoParams, clock, N,
             description="The current time as an ISO-8601 UTC timestamp."),
        Tool("demo.sleep", SleepParams, sleep, N,
             description="Wait the given number of seconds (0-3600)."),
        Tool("demo.fail", FailParams, fail, N,
             description="Always fails with the given message."),
        Tool("demo.eval", NoParams, eval_code, X, uses_code=True,
             description="Evaluate the arithmetic written in the code channel: numbers, "
                         "+ - * / // % **, unary minus and parentheses."),
        Tool("demo.focus_project", NameParams, focus_project, N, transitions_state=True,
             description="Focus a project by name; moves the conversation to the focused state."),
        Tool("demo.open_tab", NameParams, open_tab, N,
             description="Open a tab with the given name in the user's interface."),
        Tool(ASK_USER_TOOL, AskUserParams, ask_user, N,
             description="Ask the user a question, optionally with options; the turn pauses "
                         "until the answer, which becomes the observation."),
    ]


def demo_registry() -> ToolRegistry:
    return ToolRegistry(demo_tools())
