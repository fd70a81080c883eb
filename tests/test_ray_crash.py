"""Every ConversationHost SIGKILLed mid-answer, again and again: every turn still ends whole
(docs/design.md#recovery, #host-death, #delivery).

One local Ray (2 CPUs) and one gateway-side `RayBackend` for the module. Each repeat opens a fresh
set of conversations, streams a long answer in all of them, and SIGKILLs every ConversationHost
process (pids from the hosts' own `stats`) once every subscriber has seen part of the answer (the
scripted model hangs mid-answer, so no turn can end before the kill).
Some conversations are watched by a subscriber that stays subscribed through the crash; some are
watched by nobody, so only the runtime itself can bring their turns back.

Each repeat asserts, per conversation: the turn completes within TURN_TIMEOUT_S (a condition wait,
never an elapsed-time assertion); seqs have no gap and no duplicate; the final answer equals the
`answer.delta` text the subscriber saw, and is the script's whole answer (continued, not cut: no
`partial`); and the next turn works.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray

from actors.hosting.backend import UserMessage
from actors.identity import Owner
from actors.llm.scripts import register_script
from actors.profile import AgentProfile, parse_profile
from actors.ray.backend import RayBackend
from actors.ray.config import RayConfig
from actors.ray.names import DIRECTORY_NAME, NAMESPACE
from actors.tools.demo import demo_registry
from protocol.events import Event
from tests.e2e import local_ray
from tests.roundkit import action, thinking
from tests.watchkit import Watch

pytestmark = [pytest.mark.ray, pytest.mark.asyncio(loop_scope="module")]

OWNER = Owner(tenant="acme", sub="crash")
WATCHED = 6              # conversations with a subscriber that stays through the crash
UNWATCHED = 2            # conversations nobody watches: only the runtime can resume them
# Every host killed mid-answer, again and again: races show up in some runs only. The suite runs it 3
# times; REACTGATE_TEST_CRASH_REPEATS=20 looks harder (as before a change to recovery or hosting).
REPEATS = int(os.environ.get("REACTGATE_TEST_CRASH_REPEATS", "3"))
# The bound: every turn the kill cut completes within this of the kill (a condition wait). Generous:
# the replacement hosts must start first — a process, the store, LiteLLM — which took 8–12 s on
# 2 shared cores; the cut turns then resume and end within ~2 s.
TURN_TIMEOUT_S = 90.0
ANSWER = ("Rain over Paris all afternoon, twelve degrees, a west wind along the Seine; "
          "take an umbrella and a coat, and keep the evening for a café near the river. ") * 2
ANSWER = ANSWER[:250]
RESPONSE = thinking("Answering from what I know.") + action({"action": "complete", "final_answer": ANSWER})
HANG_AFTER = (RESPONSE.index(ANSWER) + 40) // 4   # chunks: the thinking, then 40-odd answer chars
_WHOLE = {"text": RESPONSE, "chunk_chars": 4, "delay_ms": 2}
SCRIPTS: dict[str, dict[str, Any]] = {
    # The first call of a conversation streams part of the answer, then hangs: its turn cannot end
    # before the kill, however late the kill comes on a loaded machine. A call that asks to continue
    # a cut response gets the rest of it (docs/design.md#scripted-model); later turns stream whole.
    "crash": {"continues": True, "rounds": [{**_WHOLE, "hang_after": HANG_AFTER}] + [_WHOLE] * 4},
    "whole": {"loop": True, "rounds": [_WHOLE]},
}


def _profile(name: str) -> AgentProfile:
    # tool-less: the answer is the first round (finish policy allow_no_tool)
    return parse_profile({
        "name": name, "model": f"scripted/crash-{name}", "states": ["default"],
        "policies": {"flush_interval_ms": 10}, "tools": [],
    }, known_tools=demo_registry())


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    with local_ray() as ray:
        yield ray


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RayBackend]:
    root = tmp_path_factory.mktemp("crash")
    scripts = {}
    for name, script in SCRIPTS.items():
        path = root / f"{name}.json"
        path.write_text(json.dumps(script))
        scripts[f"crash-{name}"] = str(path)
        register_script(f"crash-{name}", path)
    config = RayConfig(store_url=f"sqlite:///{root / 'crash.sqlite3'}", registry=demo_registry(),
                       profiles={name: _profile(name) for name in SCRIPTS}, scripts=scripts, idle_ttl_s=600, hosts=2)
    b = RayBackend(config, default_agent="crash")
    await b.start()
    yield b
    await b.stop()


def _completed(events: list[Event]) -> list[Any]:
    return [e.data for e in events if e.event == "turn.completed"]


async def _until(check: Callable[[], Any], timeout: float, poll_s: float = 0.05) -> None:
    """Until `check()` (a bool, or an awaitable of one) holds, bounded by `timeout`."""
    async def wait() -> None:
        while True:
            ok = check()
            if inspect.isawaitable(ok):
                ok = await ok
            if ok:
                return
            await asyncio.sleep(poll_s)
    await asyncio.wait_for(wait(), max(timeout, 0.0))


async def _turns_in_store(backend: RayBackend, cid: str, turns: int) -> bool:
    return len(_completed(await backend.store.read_events(cid, 0, 10_000))) >= turns


async def _host_pids(backend: RayBackend) -> list[int]:
    names = await backend.hosts()
    stats = await asyncio.gather(*(ray.get_actor(n, namespace=NAMESPACE).stats.remote() for n in names))
    return [int(s["pid"]) for s in stats]


def _check_turns(cid: str, events: list[Event], turns: int) -> None:
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(seqs) + 1)), f"{cid}: seqs with a gap or a duplicate: {seqs}"
    completed = _completed(events)
    assert len(completed) == turns, f"{cid}: {len(completed)} turn.completed, expected {turns}"
    for done in completed:
        streamed = "".join(e.data.text for e in events
                           if e.event == "answer.delta" and e.data.turn_id == done.turn_id)
        assert done.final_answer == streamed, f"{cid} {done.turn_id}: final answer is not what streamed"
        assert (done.reason, done.final_answer) == ("complete", ANSWER), f"{cid} {done.turn_id}: {done}"
        assert not getattr(done, "partial", False), f"{cid} {done.turn_id}: answer marked partial"


class _VanishedHostFirst:
    """The Directory, except that `place` first names a host that has no actor — what the real one
    answers between a host's death and the moment it has observed that death."""

    def __init__(self, real: Any, times: int) -> None:
        self._real = real
        self.times_left = times
        self.place = SimpleNamespace(remote=self._place)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def _place(self, conversation_id: str, generation: str | None = None) -> str:
        if self.times_left > 0:
            self.times_left -= 1
            return "reactgate-host-vanished"
        return str(await self._real.place.remote(conversation_id, generation))


async def test_a_route_to_a_host_that_no_longer_exists_is_retried_not_given_up(backend: RayBackend) -> None:
    # The cause of the stalled conversations: after every host was killed, the re-watch asked the
    # Directory, which still named a host whose actor was gone; `ray.get_actor` raised ValueError,
    # the re-watch gave up, and its subscriber stayed attached to nothing. Here the Directory names
    # such a host more times in a row than the old fixed number of attempts (5).
    real = ray.get_actor(DIRECTORY_NAME, namespace=NAMESPACE)
    vanished_first = _VanishedHostFirst(real, times=8)
    gateway = RayBackend(backend.config, default_agent="crash", directory=vanished_first)
    await gateway.start()
    cid = (await gateway.open(OWNER, None, "whole", None)).conversation_id
    watch = Watch(gateway, cid, owner=OWNER)
    try:
        assert await gateway.command(OWNER, cid, UserMessage(f"{cid}-1", "Weather?")) == "accepted"
        await watch.until(lambda evs: len(_completed(evs)) == 1, TURN_TIMEOUT_S)
    finally:
        await watch.stop()
        await gateway.stop()
    assert vanished_first.times_left == 0
    _check_turns(cid, watch.events, 1)


@pytest.mark.parametrize("repeat", range(REPEATS))
async def test_every_turn_completes_whole_after_every_host_is_killed_mid_answer(
    backend: RayBackend, repeat: int
) -> None:
    cids = [(await backend.open(OWNER, None, "crash", None)).conversation_id for _ in range(WATCHED + UNWATCHED)]
    watched, unwatched = cids[:WATCHED], cids[WATCHED:]
    watches = {cid: Watch(backend, cid, owner=OWNER) for cid in watched}
    try:
        await _until(lambda: all(_attached(backend, c) for c in watched), TURN_TIMEOUT_S)
        pids = await _host_pids(backend)
        acks = await asyncio.gather(*(backend.command(OWNER, c, UserMessage(f"{c}-1", "Weather?")) for c in cids))
        assert acks == ["accepted"] * len(cids)
        # every watched turn is mid-answer (and stays so: its model hangs) when the hosts die
        await _until(lambda: all(any(e.event == "answer.delta" for e in w.events) for w in watches.values()),
                     TURN_TIMEOUT_S)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        deadline = killed_at + TURN_TIMEOUT_S
        seen_at_kill = {cid: list(w.events) for cid, w in watches.items()}
        assert not any(_completed(evs) for evs in seen_at_kill.values())  # every turn was cut

        resumed_after = await asyncio.gather(
            *(_resumed(w, len(seen_at_kill[c]), killed_at, deadline) for c, w in watches.items()))
        for cid in unwatched:  # nobody watches these: only the runtime itself brings them back
            await _until(lambda c=cid: _turns_in_store(backend, c, 1), deadline - time.monotonic())
        for cid, w in watches.items():
            _check_turns(cid, w.events, 1)
        for cid in unwatched:
            _check_turns(cid, await backend.store.read_events(cid, 0, 10_000), 1)
        print(f"repeat {repeat}: watched turns resumed {statistics.median(resumed_after):.1f} s (median), "
              f"{max(resumed_after):.1f} s (max) after the kill; all done {time.monotonic() - killed_at:.1f} s after")

        # the next turn of each conversation works, on the replacement hosts
        acks = await asyncio.gather(*(backend.command(OWNER, c, UserMessage(f"{c}-2", "And now?")) for c in cids))
        assert acks == ["accepted"] * len(cids)
        await asyncio.gather(*(w.until(lambda evs: len(_completed(evs)) >= 2, TURN_TIMEOUT_S)
                               for w in watches.values()))
        for cid in unwatched:
            await _until(lambda c=cid: _turns_in_store(backend, c, 2), TURN_TIMEOUT_S)
        for cid, w in watches.items():
            _check_turns(cid, w.events, 2)
            assert [(e.seq, e.event) for e in w.events] == [
                (e.seq, e.event) for e in await backend.store.read_events(cid, 0, 10_000)]
        for cid in unwatched:
            _check_turns(cid, await backend.store.read_events(cid, 0, 10_000), 2)
    finally:
        for w in watches.values():
            await w.stop()


async def _resumed(watch: Watch, seen: int, killed_at: float, deadline: float) -> float:
    """Seconds from the kill to this subscriber's first event after it; then waits, until
    `deadline`, for its turn to complete."""
    await watch.until(lambda evs: len(evs) > seen, deadline - time.monotonic())
    resumed = time.monotonic() - killed_at
    await watch.until(lambda evs: len(_completed(evs)) >= 1, deadline - time.monotonic())
    return resumed


def _attached(backend: RayBackend, cid: str) -> bool:
    return any(cid in link.watched for link in backend._links.values())
