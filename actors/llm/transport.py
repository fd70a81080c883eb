"""The fast path's HTTP transport: one pooled aiohttp session per event loop (docs/design.md#model-settings).

A session's connections belong to the loop that opened them, so each loop has its own; it has no
connection limit (a host streams every conversation's model call at once), no cookie jar (a
provider's cookies must not ride along on another conversation's call), and no `trust_env` (aiohttp
would then look the proxy and ~/.netrc up in a thread on every request; `proxy_for` reads the proxy
variables once per endpoint instead).

Sessions are closed with aiohttp's public `close()`: by `aclose_sessions()` at shutdown; else, for
a loop that ended without it (a test's), by the next loop that asks for a session — its connector
has nothing left to await then, its sockets went with its loop; and at exit for the rest (a worker
that never closed its own), so that aiohttp has no unclosed session to report.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
from functools import lru_cache
from typing import Any, Final

import aiohttp

# A session holds its loop, so a weak map would never let go.
_sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
EXIT_WAIT_S: Final = 1.0   # at exit, for a loop still running in another thread to close its session


async def session() -> aiohttp.ClientSession:
    """This event loop's pooled session."""
    loop = asyncio.get_running_loop()
    pooled = _sessions.get(loop)
    if pooled is None or pooled.closed:
        for ended in [ended for ended in _sessions if ended.is_closed()]:
            await _sessions.pop(ended).close()
        pooled = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar(),
                                       timeout=aiohttp.ClientTimeout(total=None))
        _sessions[loop] = pooled
    return pooled


async def aclose_sessions() -> None:
    """Close this event loop's pooled session (at shutdown; tests between loops)."""
    pooled = _sessions.pop(asyncio.get_running_loop(), None)
    if pooled is not None:
        await pooled.close()


@atexit.register
def _close_at_exit() -> None:
    while _sessions:
        loop, pooled = _sessions.popitem()
        with contextlib.suppress(Exception):   # the process is going away: a session that will not close is left
            if loop.is_closed():
                asyncio.run(pooled.close())
            elif loop.is_running():   # in another thread
                asyncio.run_coroutine_threadsafe(pooled.close(), loop).result(EXIT_WAIT_S)
            else:
                loop.run_until_complete(pooled.close())


@lru_cache(maxsize=256)
def proxy_for(origin: str) -> tuple[Any, Any]:
    """The HTTP(S)_PROXY / NO_PROXY proxy for an endpoint (LiteLLM's httpx client honours them too)."""
    from aiohttp.helpers import get_env_proxy_for_url
    from yarl import URL

    try:
        return get_env_proxy_for_url(URL(origin))
    except LookupError:
        return None, None
