"""Who may open a WebSocket, and for how long (README.md#security, docs/wire-protocol.md#authentication).

Over a real server on loopback: a browser page from a foreign origin is refused with 403 with or
without auth; tokens must carry `exp` and `iat`, live at most `max_token_ttl_s`, name the
configured issuer and audience, and be signed with the configured key and algorithm, else 401; a
connection is closed with 4001 at its token's `exp`, and the client library reconnects with a
fresh token and resumes with nothing lost or repeated; the console says the session expired and
stops. The checks are the gateway's, so one run on the Ray backend of the core cases (the `serve`
fixture) shows that nothing behind the gateway changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin

from client.connection import Connection, ConnectionLost, Item
from client.session import ClientSession, Fatal, Resumed, TokenExpired
from protocol.events import Event, TurnCompleted
from protocol.frames import encode_event
from tests.e2e import (
    SECRET,
    LocalServer,
    RayHosting,
    local_server,
    ray_hosting,
    ray_server,
    run_serve,
    script,
    store_url,
    token,
)
from tests.kit import TIMEOUT
from tests.roundkit import action, call, complete, text_round, thinking
from tests.test_console import browser_page

EVIL = "https://evil.example"
ISSUER, AUDIENCE = "https://idp.example", "reactgate"
# The turn waits on a question: a token can expire mid-turn at a moment the test controls.
ASK = script(
    text_round(thinking("I need the city."), action(call("react.ask_user", question="Which city?",
                                                          options=["Paris", "Oslo"]))),
    text_round(thinking("Answering."), action(complete("It rains in Paris, 12 °C."))),
    loop=True,
)
_stores = itertools.count(1)

Serve = Callable[..., contextlib.AbstractAsyncContextManager[LocalServer]]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHosting]:
    with ray_hosting(tmp_path_factory.mktemp("ray"), {"demo": ASK}) as hosting:
        yield hosting


@pytest.fixture(params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def serve(request: pytest.FixtureRequest, tmp_path: Path) -> Serve:
    """`serve(**settings)`: a server on the local or the Ray backend playing ASK."""
    if request.param == "ray":
        hosting: RayHosting = request.getfixturevalue("ray_cluster")
        return lambda **settings: ray_server(hosting, **settings)
    return lambda **settings: local_server(tmp_path / f"s{next(_stores)}.sqlite3", ASK, **settings)


async def ping(server: LocalServer, bearer: str | None = None, origin: str | None = None) -> None:
    async with server.client(bearer, origin=Origin(origin) if origin else None) as c:
        assert (await c.request(type="ping"))["type"] == "pong"


async def refused(server: LocalServer, bearer: str | None = None, origin: str | None = None) -> tuple[int, bytes]:
    with pytest.raises(InvalidStatus) as info:
        async with server.client(bearer, origin=Origin(origin) if origin else None):
            pass
    return info.value.response.status_code, bytes(info.value.response.body)


# -- origins -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("auth", [False, True], ids=["anonymous", "with_auth"])
async def test_a_foreign_origin_is_refused_with_403_and_logged_without_the_token(
    serve: Serve, auth: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="reactgate.gateway")
    bearer = token() if auth else None
    async with serve(**({"auth_secret": SECRET} if auth else {})) as server:
        assert await refused(server, bearer, EVIL) == (403, b"forbidden: origin not allowed\n")
        await ping(server, bearer)  # a client that sends no Origin (a CLI) is not concerned
    assert f"refused a WebSocket handshake from origin '{EVIL}'" in caplog.text
    assert bearer is None or bearer not in caplog.text


async def test_without_auth_loopback_origins_are_accepted(serve: Serve) -> None:
    async with serve() as server:
        for origin in (f"http://127.0.0.1:{server.port}", "http://localhost:5173", "https://[::1]:8443"):
            await ping(server, origin=origin)


async def test_with_auth_an_allowed_origin_and_the_gateways_own_origin_are_accepted(serve: Serve) -> None:
    async with serve(auth_secret=SECRET, allowed_origins="https://app.example") as server:
        await ping(server, token(), "https://app.example")
        await ping(server, token(), f"http://127.0.0.1:{server.port}")  # Origin == Host: the console's page
        # loopback is not special with auth: only the listed origins and the gateway's own
        assert (await refused(server, token(), f"http://localhost:{server.port}"))[0] == 403


# -- tokens --------------------------------------------------------------------------------------------

BAD_TOKENS: dict[str, tuple[Callable[[], str], bytes]] = {
    "without_exp": (lambda: token(iss=ISSUER, aud=AUDIENCE, exp=None), b"token lacks the required claim 'exp'"),
    "without_iat": (lambda: token(iss=ISSUER, aud=AUDIENCE, iat=None), b"token lacks the required claim 'iat'"),
    "lifetime_too_long": (lambda: token(iss=ISSUER, aud=AUDIENCE, exp_in=86_400 + 60),
                          b"token lifetime exceeds the maximum of 86400 s (exp - iat)"),
    "wrong_iss": (lambda: token(iss="https://evil.example", aud=AUDIENCE), b"token issuer not accepted"),
    "wrong_aud": (lambda: token(iss=ISSUER, aud="another-service"), b"token audience not accepted"),
    "alg_none": (lambda: token(iss=ISSUER, aud=AUDIENCE, secret=None, algorithm="none"),
                 b"invalid token: algorithm not accepted"),
    "hs512": (lambda: token(iss=ISSUER, aud=AUDIENCE, algorithm="HS512"), b"invalid token: algorithm not accepted"),
    "wrong_key": (lambda: token(iss=ISSUER, aud=AUDIENCE, secret="another-secret-of-more-than-32-bytes"),
                  b"invalid token"),
}


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")  # HS512 with a 37-byte secret
@pytest.mark.parametrize("case", BAD_TOKENS)
async def test_a_token_outside_the_policy_is_refused_with_401(serve: Serve, case: str) -> None:
    mint, why = BAD_TOKENS[case]
    bad = mint()
    async with serve(auth_secret=SECRET, jwt_issuer=ISSUER, jwt_audience=AUDIENCE) as server:
        status, body = await refused(server, bad)
        assert (status, body) == (401, b"unauthorized: " + why + b"\n")
        assert bad.encode() not in body
        await ping(server, token(iss=ISSUER, aud=AUDIENCE))  # the same server accepts a token within it


async def test_rs256_from_a_jwks_file_is_accepted(serve: Serve, tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig"}]}))
    async with serve(jwks_file=jwks) as server:
        await ping(server, token(secret=key, algorithm="RS256", headers={"kid": "k1"}))
        assert await refused(server, token(secret=key, algorithm="RS256", headers={"kid": "k2"})) == (
            401, b"unauthorized: invalid token: unknown signing key (kid)\n")
        assert (await refused(server, token()))[0] == 401  # HS256 is not configured


@pytest.mark.slow
def test_an_hs256_secret_of_31_bytes_refuses_to_start(tmp_path: Path) -> None:
    short = "x" * 31
    store = tmp_path / "data" / "s.sqlite3"
    result = run_serve("--port", "0", "--backend", "local", "--store", store_url(store),
                       env={"REACTGATE_AUTH_SECRET": short})
    assert result.returncode == 2, result
    assert "REACTGATE_AUTH_SECRET is 31 bytes; an HS256 secret needs at least 32" in result.stderr
    assert short not in result.stderr + result.stdout
    assert not store.parent.exists()  # refused before touching anything


# -- expiry mid-connection -------------------------------------------------------------------------------


class Reader:
    """Everything a Connection yields, with a bounded wait on what arrived."""

    def __init__(self, connection: Connection) -> None:
        self.items: list[Item] = []
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(self._read(connection))

    async def _read(self, connection: Connection) -> None:
        async for item in connection:
            self.items.append(item)
            self._changed.set()
        self._changed.set()

    async def until(self, check: Callable[[], bool], timeout: float = TIMEOUT) -> None:
        async def loop() -> None:
            while not check():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), timeout)

    def of(self, kind: type[Any]) -> list[Any]:
        return [item for item in self.items if isinstance(item, kind)]


async def test_at_its_tokens_exp_a_connection_is_closed_with_4001_and_resumes_with_a_fresh_token(
    serve: Serve,
) -> None:
    tokens: list[str] = []
    away = asyncio.Event()  # set once the turn went on without the client

    async def fresh_token() -> str:
        if tokens:  # reconnecting after the expiry: let the conversation move on first
            await away.wait()
        tokens.append(token(exp_in=3 if not tokens else 3600))
        return tokens[-1]

    async with serve(auth_secret=SECRET) as server:
        session = ClientSession()
        session.user_message("weather?")
        async with Connection(session, server.url, token=fresh_token) as connection:
            reader = Reader(connection)
            await reader.until(lambda: bool(reader.of(TokenExpired)))
            assert "4001 token expired" in reader.of(ConnectionLost)[0].reason
            before = reader.of(Event)
            cid = session.conversation_id
            assert cid is not None
            # Meanwhile the owner answers the question from another connection: the rest of the turn
            # happens while this client is away.
            async with server.client(token()) as other:
                await other.subscribe(cid)
                ask = await other.event(cid, "ask_user")
                await other.request(type="answer", conversation_id=cid, ask_id=ask["data"]["ask_id"], answer="Paris")
                await other.turn_completed(cid)
            away.set()
            await reader.until(lambda: any(isinstance(e.data, TurnCompleted) for e in reader.of(Event)))
        delivered = reader.of(Event)
        log = await server.log(cid)
    assert len(tokens) == 2
    assert [r.after_seq for r in reader.of(Resumed)] == [before[-1].seq if before else 0]
    assert [encode_event(e) for e in delivered] == [encode_event(e) for e in log]  # nothing lost, nothing twice
    assert reader.of(Fatal) == []


async def test_a_fixed_token_ends_the_session_at_4001_instead_of_retrying_it(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", ASK, auth_secret=SECRET) as server:
        session = ClientSession()
        async with Connection(session, server.url, token=token(exp_in=2)) as connection:
            reader = Reader(connection)
            await reader.until(lambda: reader.task.done())  # the iteration ends by itself
        assert len(reader.of(TokenExpired)) == 1
        assert reader.of(Fatal) == [Fatal("session expired: the token expired (close 4001) — sign in again "
                                          "with a fresh token")]
        assert reader.of(ConnectionLost) == []  # no reconnect with the stale token


COUNT_SOCKETS = """
window.wsOpened = 0;
const CountedWebSocket = window.WebSocket;
window.WebSocket = class extends CountedWebSocket {
  constructor(...args) { super(...args); window.wsOpened += 1; }
};
"""


@pytest.mark.slow
async def test_the_console_says_the_session_expired_at_4001_and_stops(tmp_path: Path) -> None:
    async with local_server(tmp_path / "s.sqlite3", ASK, auth_secret=SECRET) as server, browser_page() as page:
        await page.add_init_script(COUNT_SOCKETS)
        # with auth on, the console's own page (Origin == Host) is the origin that may connect
        await page.goto(f"http://127.0.0.1:{server.port}/?token={token(exp_in=4)}")
        await page.wait_for_selector("#status-dot.up")
        await page.wait_for_function("document.getElementById('status').textContent.includes('session expired')")
        assert await page.inner_text("#status") == "session expired — sign in again"
        assert await page.evaluate("window.wsCloses") == [[4001, "token expired"]]
        assert await page.evaluate("window.reactgate.session.ended") == "token expired"
        assert await page.evaluate("window.wsOpened") == 1  # no reconnect is scheduled with the stale token
