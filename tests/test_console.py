"""The web console at GET / (docs/wire-protocol.md#12-http-endpoints-on-the-same-port): served by the gateway, dependency-free, and working in
a real browser — streaming, ask_user buttons, and resume after a drain. Its protocol rules are those
of gateway/static/reactgate.js, the JavaScript client, which it loads as an ES module (the client's
own tests, under Node against a real gateway: tests/test_js.py).

The browser tests drive Debian's Chromium through Playwright for Python. Without either they skip
with the reason, except under CI (CI=true), where a missing browser is a failure: CI's setup must
install them (`apt-get install -y chromium`, `pip install playwright`; `playwright install` is
not needed, and cannot download here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from actors.hosting.backend import Backend
from actors.llm.scripts import parse_script, register_script
from actors.profile import BUILTIN_DIR, parse_profile
from gateway.app import AgentSetup, agent_setup, build_backend
from gateway.app import local_backend as assembled_backend
from gateway.server import STATIC_DIR
from gateway.settings import Settings
from tests.gateway_harness import running
from tests.kit import http_get
from tests.test_chat import DEMO_ANSWER, SharedBackend, gateway, local_backend

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOT = Path("/tmp/console.png")
TIMEOUT_MS = 60_000
# What the page's own WebSockets do, recorded in the page: every close as [code, reason], in order
# (window.wsCloses); and per socket its URL, the subprotocol the handshake settled on (null until it
# opens, so a refused attempt keeps null), and every frame sent and received (window.wsSockets).
RECORD_SOCKETS = """
window.wsCloses = [];
window.wsSockets = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    const record = { url: this.url, protocol: null, sent: [], received: [] };
    this.record = record;
    window.wsSockets.push(record);
    this.addEventListener("open", () => { record.protocol = this.protocol; });
    this.addEventListener("message", (ev) => record.received.push(JSON.parse(ev.data)));
    this.addEventListener("close", (ev) => window.wsCloses.push([ev.code, ev.reason]));
  }
  send(data) {
    this.record.sent.push(JSON.parse(data));
    super.send(data);
  }
};
"""


# -- served by the gateway -----------------------------------------------------------------------


async def test_the_console_is_served_at_root_as_html() -> None:
    async with running() as h:
        for path in ("/", "/index.html"):
            status, headers, body = await http_get(h.host, h.port, path)
            assert status == 200
            assert headers["content-type"].startswith("text/html")
            assert b"<title>reactgate console</title>" in body
            assert b'<script type="module" src="/static/console.js">' in body


@pytest.mark.parametrize(
    ("name", "content_type"),
    [("console.js", "javascript"), ("reactgate.js", "javascript"), ("console.css", "text/css"),
     ("reactgate.d.ts", "text/plain"), ("agui-reattach.js", "javascript")],
)
async def test_the_console_assets_are_served_from_static(name: str, content_type: str) -> None:
    async with running() as h:
        status, headers, body = await http_get(h.host, h.port, f"/static/{name}")
        assert status == 200
        assert content_type in headers["content-type"]
        assert body == (STATIC_DIR / name).read_bytes()


def test_the_console_takes_its_protocol_rules_from_reactgate_js() -> None:
    """One copy of the client rules in the browser: console.js imports the client, keeps no table."""
    console = (STATIC_DIR / "console.js").read_text(encoding="utf-8")
    assert re.search(r"""^import \{[^}]*\bReactgateClient\b[^}]*\} from "\./reactgate\.js";$""", console, re.M)
    for rule in ("ERROR_REACTIONS", "RESENT_AFTER_RECONNECT", "after_seq", "new WebSocket"):
        assert rule not in console, rule


def test_the_console_has_no_external_dependencies() -> None:
    """No CDN, no build step: every URL the page loads is on the gateway itself."""
    for file in STATIC_DIR.iterdir():
        text = file.read_text(encoding="utf-8")
        assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", text), file.name
        assert not re.search(r"""import\s.*from\s+["']https?:""", text), file.name
        assert "@import" not in text, file.name


# -- in a real browser ---------------------------------------------------------------------------


def require_browser() -> None:
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package (pip install playwright)")
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install -y chromium)")
    if not missing:
        return
    reason = "browser test needs " + " and ".join(missing)
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (under CI a missing browser is a failure)")
    pytest.skip(reason)


@contextlib.asynccontextmanager
async def browser_page() -> AsyncIterator[Any]:
    require_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1100, "height": 760})
            page.set_default_timeout(TIMEOUT_MS)
            await page.add_init_script(RECORD_SOCKETS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
            assert errors == [], errors
        finally:
            await browser.close()


async def send(page: Any, text: str) -> None:
    await page.fill("#input", text)
    await page.click("#send")


async def answer_text(page: Any) -> str:
    return str(await page.inner_text(".answer"))


@pytest.mark.slow
async def test_the_console_streams_a_turn_in_chromium(tmp_path: Path) -> None:
    async with gateway(local_backend(tmp_path)) as (_, port), browser_page() as page:
        loaded: list[str] = []
        page.on("response", lambda response: loaded.append(f"{response.status} {response.url}"))
        await page.goto(f"http://127.0.0.1:{port}/")
        await page.wait_for_selector("#status-dot.up")
        assert f"200 http://127.0.0.1:{port}/static/reactgate.js" in loaded  # the client, as a module
        await send(page, "weather in Paris?")
        await page.wait_for_selector(".answer")  # streaming has begun
        await page.wait_for_selector(".done.ok")
        assert await answer_text(page) == DEMO_ANSWER
        assert await page.inner_text(".user") == "weather in Paris?"
        assert "Checking the weather in Paris." in await page.inner_text(".thinking >> nth=0")
        assert "demo.weather" in await page.inner_text(".tool")
        assert re.fullmatch(r"ok \d+ ms", await page.inner_text(".tool .badge"))
        assert re.fullmatch(r".*#c=c_[\w-]+", page.url)
        await page.screenshot(path=str(SCREENSHOT))


@pytest.mark.slow
async def test_a_reload_replays_the_conversation_from_its_id_in_the_url(tmp_path: Path) -> None:
    async with gateway(local_backend(tmp_path)) as (_, port), browser_page() as page:
        await page.goto(f"http://127.0.0.1:{port}/")
        await send(page, "weather in Paris?")
        await page.wait_for_selector(".done.ok")
        url = page.url
        await page.reload()
        await page.wait_for_selector(".done.ok")
        assert page.url == url
        assert await answer_text(page) == DEMO_ANSWER
        assert await page.inner_text(".user") == "weather in Paris?"  # our own words, from the log
        assert await page.locator(".turn").count() == 1


@pytest.mark.slow
async def test_a_second_device_shows_the_users_own_words_from_the_log(tmp_path: Path) -> None:
    """The words come from `user.message` events, not from what one browser remembers: a fresh
    browser (nothing stored) opening the conversation's URL shows them."""
    async with gateway(local_backend(tmp_path)) as (_, port):
        async with browser_page() as page:
            await page.goto(f"http://127.0.0.1:{port}/")
            await send(page, "weather in Paris?")
            await page.wait_for_selector(".done.ok")
            url = page.url
        async with browser_page() as other:   # another browser: its own, empty storage
            await other.goto(url)
            await other.wait_for_selector(".done.ok")
            assert await other.inner_text(".user") == "weather in Paris?"
            assert await other.locator(".user.unknown").count() == 0
            assert await answer_text(other) == DEMO_ANSWER


@pytest.mark.slow
async def test_the_console_resumes_after_a_drain_without_loss_or_duplicate(tmp_path: Path) -> None:
    backend = SharedBackend(local_backend(tmp_path))
    try:
        async with gateway(backend) as (first, port), browser_page() as page:
            await page.goto(f"http://127.0.0.1:{port}/")
            await page.wait_for_selector("#status-dot.up")
            await send(page, "weather in Paris?")
            await page.wait_for_selector(".answer")
            await first.drain()  # the page sees close 1012 mid-answer; the turn goes on in the backend
            await page.wait_for_selector("#status-dot.down")
            # The status line moves on as reconnects to the stopped port fail, so read the closes
            # the browser itself recorded: the first is the drain's 1012.
            closes = await page.evaluate("window.wsCloses")
            assert closes[0] == [1012, "server draining"], closes
            assert all(code == 1006 for code, _ in closes[1:]), closes  # refused reconnects
            async with gateway(backend, port):
                # The page reconnects on its own backoff; on a loaded machine the turn may have ended
                # before the drain's close reached it, so wait for the resume rather than read it once.
                await page.wait_for_function(
                    "document.querySelector('#status').innerText.includes('resumed after seq')")
                await page.wait_for_selector(".done.ok")
                assert await answer_text(page) == DEMO_ANSWER
                assert await page.locator(".answer").count() == 1
                assert await page.locator(".tool").count() == 1
    finally:
        await backend.inner.stop()


@pytest.mark.slow
async def test_the_console_sends_its_page_token_speaks_reactgate_v1_and_resubscribes_after_its_last_seq(
    tmp_path: Path,
) -> None:
    """What the page puts on the wire, not what its source says: every WebSocket goes to /ws with the
    page URL's ?token= (a browser cannot set an Authorization header) and settles on reactgate.v1;
    after a drain, the subscribe on the new connection asks for what follows the last seq the page
    received (not a replay from 0 that it would have to throw away), and that is what arrives."""
    secret = "console-test-secret-for-hs256-at-least-32-bytes"
    now = int(time.time())
    token = jwt.encode({"sub": "alice", "tenant": "acme", "iat": now, "exp": now + 600}, secret, algorithm="HS256")
    backend = SharedBackend(local_backend(tmp_path))
    try:
        async with gateway(backend, auth_secret=secret) as (first, port), browser_page() as page:
            await page.goto(f"http://127.0.0.1:{port}/?token={token}")
            await page.wait_for_selector("#status-dot.up")  # the gateway requires the token: it got it
            await send(page, "weather in Paris?")
            await page.wait_for_selector(".answer")
            await first.drain()
            await page.wait_for_selector("#status-dot.down")
            async with gateway(backend, port, auth_secret=secret):
                await page.wait_for_selector(".done.ok")
                assert await answer_text(page) == DEMO_ANSWER
                sockets = await page.evaluate("window.wsSockets")
    finally:
        await backend.inner.stop()

    assert {s["url"] for s in sockets} == {f"ws://127.0.0.1:{port}/ws?token={token}"}
    opened = [s for s in sockets if s["protocol"] is not None]  # the refused reconnects never opened
    assert len(opened) >= 2 and {s["protocol"] for s in opened} == {"reactgate.v1"}
    before, after = opened[0], opened[-1]

    def seqs(socket: dict[str, Any]) -> list[int]:
        return [f["seq"] for f in socket["received"] if f["type"] == "event"]

    def subscribed_after(socket: dict[str, Any]) -> list[int]:
        return [f["after_seq"] for f in socket["sent"] if f["type"] == "subscribe"]

    last = seqs(before)[-1]
    assert seqs(before) == list(range(1, last + 1))
    assert subscribed_after(before)[0] == 0                   # a new conversation: from its start
    assert subscribed_after(after)[0] == last                 # resumed: after the last seq received
    assert seqs(after) == list(range(last + 1, last + 1 + len(seqs(after))))


ASK_SCRIPT = {
    "rounds": [
        {"text": "<channel:thinking>I need the city.</channel:thinking><channel:action>"
                 + json.dumps({"action": "call_tool", "tool_call": {"tool_id": "react.ask_user", "params": {
                     "question": "Which city?", "options": ["Paris", "Oslo"]}}})
                 + "</channel:action>"},
        {"text": "<channel:thinking>Got it.</channel:thinking><channel:action>"
                 + json.dumps({"action": "complete", "final_answer": "You chose a city."})
                 + "</channel:action>"},
    ]
}


def ask_backend(tmp_path: Path) -> Any:
    script = tmp_path / "ask.json"
    script.write_text(json.dumps(ASK_SCRIPT))
    return build_backend(Settings(backend="local", port=0, store=f"sqlite:///{tmp_path}/ask.sqlite3", script=script))


def confirm_backend(tmp_path: Path) -> Any:
    """The demo agent with `confirm_writes = true`, playing: focus a project, write a note, answer."""
    def step(tool_id: str, **params: Any) -> dict[str, str]:
        return {"text": "<channel:thinking>Working.</channel:thinking><channel:action>"
                + json.dumps({"action": "call_tool", "tool_call": {"tool_id": tool_id, "params": params}})
                + "</channel:action>"}

    script = tmp_path / "confirm.json"
    script.write_text(json.dumps({"rounds": [
        step("demo.focus_project", name="groceries"), step("demo.write_note", text="milk"),
        {"text": "<channel:thinking>Done.</channel:thinking><channel:action>"
                 + json.dumps({"action": "complete", "final_answer": "Noted."}) + "</channel:action>"},
    ]}))
    profile = tmp_path / "confirm.toml"
    profile.write_text("confirm_writes = true\n" + (BUILTIN_DIR / "demo.toml").read_text())
    return build_backend(Settings(backend="local", port=0, store=f"sqlite:///{tmp_path}/confirm.sqlite3",
                                  script=script, agent=str(profile)))


@pytest.mark.slow
async def test_an_approval_shows_the_call_and_its_params_and_approve_runs_it(tmp_path: Path) -> None:
    """Execute confirmation in the page (docs/design.md#execute-confirmation): the request names the
    tool and its params, offers exactly the three decisions, and a click on Approve runs the call."""
    async with gateway(confirm_backend(tmp_path)) as (_, port), browser_page() as page:
        await page.goto(f"http://127.0.0.1:{port}/")
        await send(page, "note milk")
        await page.wait_for_selector(".ask.approval .options button")
        assert await page.inner_text(".ask.approval .params") == 'demo.write_note {"text":"milk"}'
        buttons = await page.locator(".ask.approval .options button").all_inner_texts()
        assert buttons == ["Approve", "Deny", "Approve all"]
        assert await page.locator(".ask.approval form.free").count() == 0   # a yes or a no, nothing typed
        await page.click(".ask.approval .options button:has-text('Approve')")
        await page.wait_for_selector(".done.ok")
        assert "demo.write_note: approved" in await page.inner_text("#transcript")
        sent = [f for s in await page.evaluate("window.wsSockets") for f in s["sent"] if f["type"] == "answer"]
        assert [f["answer"] for f in sent] == ["Approve"]


@pytest.mark.slow
async def test_ask_user_options_are_buttons_whose_click_answers_the_question(tmp_path: Path) -> None:
    async with gateway(ask_backend(tmp_path)) as (_, port), browser_page() as page:
        await page.goto(f"http://127.0.0.1:{port}/")
        await send(page, "weather?")
        await page.wait_for_selector(".ask .options button")
        assert await page.inner_text(".ask .question") == "Which city?"
        await page.click(".ask .options button:has-text('Oslo')")
        await page.wait_for_selector(".done.ok")
        assert "answered: Oslo" in await page.inner_text(".ask .outcome")
        assert '{"answer":"Oslo"}' in await page.inner_text(".tool .result")
        assert await answer_text(page) == "You chose a city."


@pytest.mark.slow
async def test_mode_toggle_sends_set_mode_and_shows_the_acked_mode(tmp_path: Path) -> None:
    async with gateway(local_backend(tmp_path)) as (_, port), browser_page() as page:
        await page.goto(f"http://127.0.0.1:{port}/")
        await page.wait_for_selector("#status-dot.up")
        await page.click("#mode-ask")
        await page.wait_for_function("window.reactgate.session.mode === 'ask' && window.reactgate.session.pending.size === 0")
        assert await page.get_attribute("#mode-ask", "aria-pressed") == "true"
        assert await page.get_attribute("#mode-agent", "aria-pressed") == "false"


@pytest.mark.slow
async def test_steer_and_cancel_are_enabled_during_a_turn_and_cancel_ends_it(tmp_path: Path) -> None:
    async with gateway(ask_backend(tmp_path)) as (_, port), browser_page() as page:
        await page.goto(f"http://127.0.0.1:{port}/")
        await page.wait_for_selector("#status-dot.up")
        assert await page.is_disabled("#cancel") and await page.is_disabled("#steer")
        await send(page, "weather?")
        await page.wait_for_selector(".ask .options button")  # the turn is paused on the question
        assert await page.is_enabled("#cancel") and await page.is_enabled("#steer")
        await page.click("#cancel")
        await page.wait_for_selector(".done.bad")
        assert await page.inner_text(".done") == "cancelled"
        assert "closed" in await page.inner_text(".ask .outcome") or "no answer" in await page.inner_text(
            ".ask .outcome"
        )
        assert await page.is_disabled("#cancel")


SECOND_ANSWER = "It is noon, says the second agent."
SECOND_SCRIPT = {"loop": True, "rounds": [
    {"text": "<channel:thinking>Checking the time.</channel:thinking><channel:action>"
             + json.dumps({"action": "call_tool", "tool_call": {"tool_id": "demo.clock", "params": {}}})
             + "</channel:action>"},
    {"text": "<channel:thinking>Answering.</channel:thinking><channel:action>"
             + json.dumps({"action": "complete", "final_answer": SECOND_ANSWER}) + "</channel:action>"},
]}


def two_agents_backend(tmp_path: Path) -> Backend:
    """The demo agent (the default) and `second`, which tells the time with its own script
    (docs/design.md#several-agents)."""
    register_script("console-second", parse_script(SECOND_SCRIPT))
    settings = Settings(backend="local", port=0, store=f"sqlite:///{tmp_path}/agents.sqlite3")
    demo = agent_setup(settings)
    second = parse_profile({"name": "second", "description": "Tells the time.", "model": "scripted/console-second",
                            "tools": [{"id": "demo.clock"}]}, known_tools=demo.registry)
    return assembled_backend(settings, AgentSetup(demo.profile, demo.registry, None, (second,)))


@pytest.mark.slow
async def test_the_console_offers_the_served_agents_and_opens_a_conversation_with_the_one_picked(
    tmp_path: Path,
) -> None:
    secret = "console-test-secret-for-hs256-at-least-32-bytes"
    now = int(time.time())
    token = jwt.encode({"sub": "alice", "tenant": "acme", "iat": now, "exp": now + 600}, secret, algorithm="HS256")
    async with gateway(two_agents_backend(tmp_path), auth_secret=secret) as (_, port), browser_page() as page:
        await page.goto(f"http://127.0.0.1:{port}/?token={token}")   # GET /agents needs the token too
        await page.wait_for_selector("#status-dot.up")
        options = await page.eval_on_selector_all("#agent option", "os => os.map(o => [o.value, o.title])")
        assert options == [["demo", demo_description()], ["second", "Tells the time."]]
        assert await page.input_value("#agent") == "demo"               # the default, until another is picked
        first = page.url
        await page.select_option("#agent", "second")                    # a new conversation, with that agent
        await page.wait_for_function("window.reactgate.session.ready && window.reactgate.session.agent === 'second'")
        assert page.url != first
        await send(page, "what time is it?")
        await page.wait_for_selector(".done.ok")
        assert await answer_text(page) == SECOND_ANSWER
        assert "demo.clock" in await page.inner_text(".tool")
        sockets = await page.evaluate("window.wsSockets")
    opens = [f for s in sockets for f in s["sent"] if f["type"] == "open"]
    assert [f.get("agent") for f in opens] == ["demo", "second"] and "conversation_id" not in opens[-1]


def demo_description() -> str:
    from actors.profile import demo_profile

    return demo_profile().summary
