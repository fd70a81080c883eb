"""The peer's agent for bench/peer_bench.py: LangGraph's prebuilt ReAct agent, served by the Agent
Server (`langgraph dev`), on the bench's mock model over OpenAI-compatible SSE.

The same work as reactgate's side of the bench: one tool, `demo_weather` (the function name
reactgate gives its `demo.weather` tool in native mode, with the same table), called by the
model's native function call, then the streamed answer. Runs in the peer's own venv
(bench/peer/requirements.txt), never imported by the project.
"""

from __future__ import annotations

import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

WEATHER = {
    "paris": {"city": "Paris", "condition": "rain", "temp_c": 12},
    "london": {"city": "London", "condition": "cloudy", "temp_c": 9},
    "berlin": {"city": "Berlin", "condition": "snow", "temp_c": -2},
    "tokyo": {"city": "Tokyo", "condition": "sunny", "temp_c": 18},
    "new york": {"city": "New York", "condition": "windy", "temp_c": 5},
    "madrid": {"city": "Madrid", "condition": "sunny", "temp_c": 21},
}


@tool
async def demo_weather(city: str) -> dict:
    """Current weather of a city (read-only)."""
    row = WEATHER.get(" ".join(city.lower().split()))
    if row is None:
        raise LookupError("no weather data for that city; known cities: " + ", ".join(r["city"] for r in WEATHER.values()))
    return dict(row)


model = ChatOpenAI(model="mock", base_url=os.environ["PEER_BENCH_MOCK_URL"], api_key="loopback-mock",
                   streaming=True, max_retries=0, timeout=60)
graph = create_react_agent(model, [demo_weather], prompt="You are a helpful assistant. Use the tools to answer.")
