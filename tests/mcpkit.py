"""What the MCP face's tests share (tests/test_e2e_mcp_face.py, tests/test_js.py's MCP file): the agents
the gateway serves for them, and an official `mcp` Python SDK client session over streamable HTTP.

Two agents on the demo tools (docs/design.md#demo-tools), with rules the tests can reach quickly:
- `face`: states default/focused; `demo.render` only when focused (so focusing changes the list);
  `demo.sleep` declared an exploration tool (a slow one, for the trait matrix and cancellation);
  an exploration budget of 3; every write tool (`demo.write_note`) waits for approval; observe by default;
- `big`: the same, with `[mcp_face] catalog_max = 3` and `demo.clock` as a core tool, so its list is
  compact: the core tools and `search_capabilities`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation, InitializeResult

from actors.profile import AgentProfile, load_profile
from actors.tools.demo import demo_registry

PROFILE = """
name = "{name}"
model = "scripted/unused"
states = ["default", "focused"]
confirm_writes = true
[policies]
exploration_soft_cap = 3
ask_user_timeout_s = {timeout_s}
flush_interval_ms = 10
[mcp_face]
access = "observe"
{face}
[[tools]]
id = "demo.weather"
[[tools]]
id = "demo.search"
[[tools]]
id = "demo.render"
states = ["focused"]
[[tools]]
id = "demo.write_note"
[[tools]]
id = "demo.clock"
[[tools]]
id = "demo.sleep"
trait = "exploration"
[[tools]]
id = "demo.focus_project"
[[tools]]
id = "demo.eval"
[[tools]]
id = "react.ask_user"
"""


def face_profile(name: str = "face", *, face: str = "", timeout_s: float = 30) -> AgentProfile:
    return load_profile(PROFILE.format(name=name, face=face, timeout_s=timeout_s), known_tools=demo_registry())


def big_profile() -> AgentProfile:
    return face_profile("big", face='catalog_max = 3\ncore_tools = ["demo.clock"]')


def mcp_url(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/ws") + "/mcp"


@contextlib.asynccontextmanager
async def mcp_session(url: str, bearer: str | None = None, *, query: str = "", name: str = "pytest-agent",
                      headers: dict[str, str] | None = None,
                      elicit: Callable[..., Awaitable[Any]] | None = None,
                      on_message: Callable[[Any], Awaitable[None]] | None = None,
                      ) -> AsyncIterator[tuple[ClientSession, InitializeResult]]:
    """An initialized `ClientSession` of the official SDK on `url` (streamable HTTP), with `bearer` as
    its token; `elicit`: the client declares elicitation and answers with it; `on_message`: every
    notification the server sends."""
    sent = {**({"Authorization": f"Bearer {bearer}"} if bearer else {}), **(headers or {})}
    async with httpx2.AsyncClient(headers=sent, timeout=60) as http, \
            streamable_http_client(url + query, http_client=http) as (read, write):
        kwargs: dict[str, Any] = {"client_info": Implementation(name=name, version="1.0")}
        if elicit is not None:
            kwargs["elicitation_callback"] = elicit
        if on_message is not None:
            kwargs["message_handler"] = on_message
        async with ClientSession(read, write, **kwargs) as session:
            yield session, await session.initialize()


def conversation_of(result: InitializeResult) -> str:
    meta = result.meta or {}
    return str(meta["reactgate/conversation_id"])
