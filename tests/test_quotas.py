"""Quotas (docs/design.md#quotas): the policy table, its windows on a hand-driven clock, the refusal
on the wire, the Meter over a real store, and the tool-calls-per-turn backstop in a conversation."""

from __future__ import annotations

import contextlib
import os
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from actors.hosting.meter import Meter
from actors.identity import Owner
from actors.llm.mock_server import start_mock_server
from actors.llm.scripts import RoundUsage, parse_script
from actors.llm.stream import ModelFinished, Usage, stream_model
from actors.quotas import (
    QUOTAS,
    Charged,
    Keeper,
    Quota,
    QuotaCharge,
    QuotaCounter,
    QuotaExceeded,
    QuotaLimits,
    Scope,
    TenantUsage,
    admitted_tool_calls,
    connection_refusal,
    counter,
    current_usage,
    estimate_tokens,
    iso,
    refusal,
    resets_at,
    scope_key,
    slot_charges,
    tokens_refusal,
    turn_charges,
    window_start,
)
from actors.store.sqlite import SqliteStore
from gateway.limits import quota_limits
from gateway.settings import Settings
from protocol.frames import ErrorCode, ErrorFrame, decode_server_frame, encode_frame
from tests.convkit import harness, rounds_script, script_model, tool_round
from tests.gateway_harness import running
from tests.kit import wait_until
from tests.roundkit import action, call, complete, text_round, thinking

ALICE = Owner(tenant="acme", sub="alice")
BOB = Owner(tenant="acme", sub="bob")
EVE = Owner(tenant="other", sub="eve")
T0 = 1_700_000_000.0           # a minute boundary plus 20 s; every window test starts here


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the policy, by what it makes happen ---------------------------------------------------------------
#
# One case per row of `QUOTAS`, each through the shell that enforces it: the limit comes from the row's
# setting, the quota trips at that limit with a refusal naming the row, and frees up again — after its
# window for a windowed row, once what it counts is released for a gauge. A row without a case here
# fails (KeyError); a row whose window, keeper or charging does not match what the shell does fails.

LIMIT = 2


def limits_for(key: tuple[Quota, Scope]) -> dict[str, int]:
    """The gateway setting the row names, at LIMIT; every other quota keeps its default."""
    return {QUOTAS[key].setting: LIMIT}


@dataclass(frozen=True)
class StoreUse:
    """How the hosts use a store-kept quota: `take` uses unit i; `gated` is what a refusal stops (the
    taking itself when charged before, the next turn when counted after); `release` gives unit i
    back (None: only the window frees it)."""

    take: Callable[[Meter, Owner, int], Awaitable[object]]
    gated: Callable[[Meter, Owner, int], Awaitable[object]]
    release: Callable[[Meter, Owner, int], Awaitable[object]] | None = None


STORE_USES: dict[Quota, StoreUse] = {
    Quota.OPEN_CONVERSATIONS: StoreUse(
        take=lambda m, who, i: m.open_conversation(who), gated=lambda m, who, i: m.open_conversation(who),
        release=lambda m, who, i: m.conversation_gone(who, f"c{i}")),
    Quota.CONCURRENT_TURNS: StoreUse(
        take=lambda m, who, i: m.take_slot(who, f"c{i}"), gated=lambda m, who, i: m.take_slot(who, f"c{i}"),
        release=lambda m, who, i: m.release_slot(who, f"c{i}")),
    Quota.TURNS_PER_MINUTE: StoreUse(
        take=lambda m, who, i: m.admit_turn(who), gated=lambda m, who, i: m.admit_turn(who)),
    Quota.TOKENS_PER_DAY: StoreUse(
        take=lambda m, who, i: m.charge_tokens(who, 1), gated=lambda m, who, i: m.admit_turn(who)),
}


@contextlib.asynccontextmanager
async def opened_store(path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(str(path))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def trips_and_resets_in_the_store(key: tuple[Quota, Scope], tmp_path: Path) -> None:
    quota, scope = key
    rule, use = QUOTAS[key], STORE_USES[quota]
    assert rule.keeper is Keeper.STORE
    members = [ALICE, BOB] if scope is Scope.TENANT else [ALICE]   # who shares the counter
    outsider = EVE if scope is Scope.TENANT else BOB               # who does not
    limits = quota_limits(Settings(**limits_for(key)))
    clock, path = Clock(), tmp_path / "quotas.sqlite3"

    def member(i: int) -> Owner:
        return members[i % len(members)]

    async def refused(i: int) -> QuotaExceeded:
        with pytest.raises(QuotaExceeded) as caught:
            await use.gated(meter, member(i), i)
        assert (caught.value.quota, caught.value.scope, caught.value.limit) == (quota, scope, LIMIT)
        return caught.value

    async def fill(first: int) -> None:
        """LIMIT units, the scope's members in turn; the gated request passes until the last one."""
        for i in range(first, first + LIMIT):
            if rule.charged is Charged.AFTER:
                await use.gated(meter, member(i), i)      # below the limit: admitted
            await use.take(meter, member(i), i)

    async with opened_store(path) as store:
        meter = Meter(store, limits, clock)
        await fill(0)
        refusal = await refused(LIMIT)
        if rule.charged is Charged.AFTER:
            await use.take(meter, member(0), 0)           # counted past the limit all the same
            assert await store.quota_counts([counter(quota, scope, member(0), clock.now)]) == [LIMIT + 1]
        await use.gated(meter, outsider, 99)              # another key of the scope: a counter of its own
    async with opened_store(path) as store:               # a restart: the count is the store's
        meter = Meter(store, limits, clock)
        await refused(LIMIT)
        if rule.window_s is None:
            assert refusal.resets_at is None and use.release is not None
            clock.now += 3 * 86_400                       # a gauge does not free up with time
            await refused(LIMIT)
            await use.release(meter, member(0), 0)
            await use.gated(meter, member(LIMIT), LIMIT)  # one unit back: exactly one more, the refused not counted
            await refused(LIMIT + 1)
        else:
            assert refusal.resets_at is not None and refusal.resets_at % rule.window_s == 0
            assert T0 < refusal.resets_at <= T0 + rule.window_s
            clock.now = refusal.resets_at - 0.001
            await refused(LIMIT)                          # the same window to its last instant
            clock.now = refusal.resets_at
            await fill(LIMIT)                             # the next window: the whole limit again
            await refused(2 * LIMIT)


async def trips_and_resets_per_turn(key: tuple[Quota, Scope], tmp_path: Path) -> None:
    assert QUOTAS[key].keeper is Keeper.TURN and QUOTAS[key].window_s is None
    h = harness(rounds_script(
        tool_round("demo.clock"),
        text_round(thinking("Two more."), action(call("demo.clock")), action(call("demo.weather", city="Paris"))),
        text_round(thinking("Done."), action(complete("It is noon."))),
        loop=True,
    ))
    h.conv.runtime.quotas = quota_limits(Settings(**limits_for(key)))
    for turn in ("first", "second"):                      # the second turn: a count of its own
        before = len(h.events)
        done = await h.turn(turn)
        assert (done["reason"], done["final_answer"]) == ("complete", "It is noon.")
        results = [e.data for e in h.events[before:] if e.event == "tool.result"]
        assert [(r.tool_id, r.ok, r.error) for r in results] == [
            ("demo.clock", True, None), ("demo.weather", False, "quota_exceeded"), ("demo.clock", True, None)]
        assert results[1].detail is not None and results[1].detail["limit"] == LIMIT


async def trips_and_resets_per_replica(key: tuple[Quota, Scope], tmp_path: Path) -> None:
    quota, scope = key
    assert QUOTAS[key].keeper is Keeper.REPLICA and QUOTAS[key].window_s is None
    # Anonymous loopback: every client is the same user from the same address.
    async with (running(**limits_for(key)) as gateway, running(**limits_for(key)) as other_replica,
                contextlib.AsyncExitStack() as held):
        clients = [await held.enter_async_context(gateway.client()) for _ in range(LIMIT)]
        for c in clients:
            assert (await c.request(type="ping"))["type"] == "pong"
        async with gateway.client() as turned_away:
            frame = await turned_away.recv()
            assert (frame["code"], frame["quota"], frame["scope"]) == ("quota_exceeded", quota, scope), frame
            assert (await turned_away.closed()).rcvd.code == 1013
        async with other_replica.client() as elsewhere:   # counted in each replica's memory
            assert (await elsewhere.request(type="ping"))["type"] == "pong"
        await clients[0].ws.close()
        await wait_until(lambda: len(gateway.server.sessions) == LIMIT - 1)
        async with gateway.client() as freed:             # a closed connection frees its unit
            assert (await freed.request(type="ping"))["type"] == "pong"


TRIPS_AND_RESETS: dict[Keeper, Callable[[tuple[Quota, Scope], Path], Awaitable[None]]] = {
    Keeper.STORE: trips_and_resets_in_the_store,
    Keeper.TURN: trips_and_resets_per_turn,
    Keeper.REPLICA: trips_and_resets_per_replica,
}


@pytest.mark.parametrize("key", list(QUOTAS), ids=[f"{q}-{s}" for q, s in QUOTAS])
async def test_each_quota_trips_at_its_limit_and_frees_up(
    key: tuple[Quota, Scope], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [k for k in os.environ if k.startswith("REACTGATE_")]:
        monkeypatch.delenv(name)
    await TRIPS_AND_RESETS[QUOTAS[key].keeper](key, tmp_path)


def test_every_quota_is_a_setting_with_its_documented_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("REACTGATE_QUOTA")]:
        monkeypatch.delenv(name)
    defaults = quota_limits(Settings()).values
    assert {QUOTAS[key].setting: value for key, value in defaults.items()} == {
        "quota_open_conversations_per_user": 1_000,
        "quota_open_conversations_per_tenant": 100_000,
        "quota_concurrent_turns_per_user": 16,
        "quota_concurrent_turns_per_tenant": 1_000,
        "quota_turns_per_minute_per_user": 120,
        "quota_turns_per_minute_per_tenant": 6_000,
        "quota_tokens_per_day_per_user": 5_000_000,
        "quota_tokens_per_day_per_tenant": 200_000_000,
        "quota_tool_calls_per_turn": 50,
        "quota_connections_per_ip": 256,
        "quota_connections_per_user": 64,
    }
    monkeypatch.setenv("REACTGATE_QUOTA_TURNS_PER_MINUTE_PER_USER", "7")
    assert quota_limits(Settings()).limit(Quota.TURNS_PER_MINUTE, Scope.USER) == 7


def test_each_quota_setting_sets_the_limit_of_its_own_rule_and_no_other() -> None:
    distinct = {rule.setting: 1_000 + i for i, rule in enumerate(QUOTAS.values())}
    assert quota_limits(Settings(**distinct)).values == {key: distinct[rule.setting] for key, rule in QUOTAS.items()}


def test_a_zero_limit_is_no_limit() -> None:
    limits = QuotaLimits({(Quota.TURNS_PER_MINUTE, Scope.USER): 0, (Quota.TURNS_PER_MINUTE, Scope.TENANT): 3})
    assert limits.limit(Quota.TURNS_PER_MINUTE, Scope.USER) is None
    assert limits.limit(Quota.TURNS_PER_MINUTE, Scope.TENANT) == 3
    assert limits.limit(Quota.CONNECTIONS, Scope.IP) is None            # absent: no limit either
    assert not limits.limits_tokens
    assert QuotaLimits({(Quota.TOKENS_PER_DAY, Scope.TENANT): 1}).limits_tokens


# -- windows, on a hand-driven clock ------------------------------------------------------------


def test_a_window_is_epoch_aligned_and_resets_at_its_end() -> None:
    start = window_start(60, T0)
    assert start % 60 == 0 and start <= T0 < start + 60
    assert resets_at(60, T0) == start + 60
    assert window_start(60, start + 59.999) == start           # the same window to its last instant
    assert window_start(60, start + 60) == start + 60          # the next one at its end
    assert window_start(86_400, T0) % 86_400 == 0              # a day: midnight UTC


def test_a_gauge_has_no_window_and_no_reset() -> None:
    assert window_start(None, T0) == 0 and resets_at(None, T0) is None


def test_resets_at_on_the_wire_is_utc_iso_to_the_second() -> None:
    assert iso(0) == "1970-01-01T00:00:00Z"
    assert iso(86_400 + 3600 + 61) == "1970-01-02T01:01:01Z"


def test_user_keys_cannot_collide_whatever_the_claims_hold() -> None:
    assert scope_key(Scope.USER, Owner("a:b", "c")) != scope_key(Scope.USER, Owner("a", "b:c"))
    assert scope_key(Scope.TENANT, ALICE) == scope_key(Scope.TENANT, BOB) == "acme"
    assert scope_key(Scope.USER, ALICE) != scope_key(Scope.USER, BOB)


def test_a_turn_charges_the_user_first_then_the_tenant_in_the_current_minute() -> None:
    limits = QuotaLimits({(Quota.TURNS_PER_MINUTE, Scope.USER): 3, (Quota.TURNS_PER_MINUTE, Scope.TENANT): 5})
    user, tenant = turn_charges(limits, ALICE, T0)
    start = window_start(60, T0)
    assert user == QuotaCharge(QuotaCounter("user", scope_key(Scope.USER, ALICE), "turns_per_minute", start), 1, 3)
    assert tenant == QuotaCharge(QuotaCounter("tenant", "acme", "turns_per_minute", start), 1, 5)


def test_a_slot_is_a_lease_of_one_then_the_counts() -> None:
    lease, user, tenant = slot_charges(QuotaLimits(), ALICE, "c_1")
    assert lease == QuotaCharge(QuotaCounter("conversation", "c_1", "concurrent_turns", 0), 1, 1)
    assert (user.counter.scope, tenant.counter.scope, user.limit, tenant.limit) == ("user", "tenant", None, None)


def test_a_refused_charge_names_its_quota_scope_and_reset() -> None:
    _, tenant = turn_charges(QuotaLimits({(Quota.TURNS_PER_MINUTE, Scope.TENANT): 5}), ALICE, T0)
    refused = refusal(tenant, T0)
    assert (refused.quota, refused.scope, refused.limit) == (Quota.TURNS_PER_MINUTE, Scope.TENANT, 5)
    assert refused.resets_at == window_start(60, T0) + 60
    assert refused.message == f"quota exceeded: turns_per_minute per tenant (limit 5); resets at {refused.resets_at_iso}"
    gauge = refusal(slot_charges(QuotaLimits({(Quota.CONCURRENT_TURNS, Scope.USER): 2}), ALICE, "c")[1], T0)
    assert gauge.resets_at is None and gauge.resets_at_iso is None
    assert gauge.message == "quota exceeded: concurrent_turns per user (limit 2); frees up as running turns end"


def test_tokens_refuse_once_used_reaches_the_limit_user_before_tenant() -> None:
    limits = QuotaLimits({(Quota.TOKENS_PER_DAY, Scope.USER): 100, (Quota.TOKENS_PER_DAY, Scope.TENANT): 150})
    assert tokens_refusal(limits, ALICE, [99, 149], T0) is None
    user = tokens_refusal(limits, ALICE, [100, 150], T0)
    assert user is not None and (user.scope, user.resets_at) == (Scope.USER, window_start(86_400, T0) + 86_400)
    tenant = tokens_refusal(limits, ALICE, [10, 150], T0)
    assert tenant is not None and tenant.scope is Scope.TENANT


def test_tokens_are_estimated_at_four_characters_each_rounded_up() -> None:
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 400)] == [0, 1, 1, 2, 100]


def test_tool_calls_admitted_up_to_the_limit() -> None:
    assert admitted_tool_calls(0, 2, None) == 2
    assert admitted_tool_calls(1, 2, 2) == 1
    assert admitted_tool_calls(2, 2, 2) == 0
    assert admitted_tool_calls(5, 1, 2) == 0


def test_connections_refused_by_address_then_by_user() -> None:
    limits = QuotaLimits({(Quota.CONNECTIONS, Scope.IP): 3, (Quota.CONNECTIONS, Scope.USER): 2})
    assert connection_refusal(limits, 2, 1) is None
    user = connection_refusal(limits, 2, 2)
    assert user is not None and (user.quota, user.scope, user.resets_at) == (Quota.CONNECTIONS, Scope.USER, None)
    ip = connection_refusal(limits, 3, 2)
    assert ip is not None and ip.scope is Scope.IP


def test_metrics_keep_only_the_current_windows() -> None:
    minute, day = window_start(60, T0), window_start(86_400, T0)
    rows = [("acme", "turns_per_minute", minute, 3), ("acme", "turns_per_minute", minute - 60, 9),
            ("acme", "tokens_per_day", day, 500), ("acme", "tokens_per_day", day - 86_400, 7),
            ("acme", "open_conversations", 0, 2), ("other", "concurrent_turns", 0, 1)]
    assert current_usage(rows, T0) == [
        TenantUsage("acme", "open_conversations", 2), TenantUsage("acme", "tokens_per_day", 500),
        TenantUsage("acme", "turns_per_minute", 3), TenantUsage("other", "concurrent_turns", 1),
    ]
    assert "turns_per_minute" not in {u.quota for u in current_usage(rows, T0 + 60)}  # its minute is over


def test_a_refusal_survives_pickling_as_it_crosses_from_a_ray_host() -> None:
    refused = QuotaExceeded(Quota.TURNS_PER_MINUTE, Scope.USER, 3, T0)
    copy = pickle.loads(pickle.dumps(refused))
    assert (copy.quota, copy.scope, copy.limit, copy.resets_at, str(copy)) == (
        refused.quota, refused.scope, 3, T0, str(refused))


# -- the error frame: new fields only where they apply ----------------------------------------------


def test_other_error_frames_keep_their_bytes() -> None:
    frame = ErrorFrame(code=ErrorCode.SLOW_CONSUMER, message="m", conversation_id="c", last_seq=3)
    assert encode_frame(frame) == b'{"type":"error","code":"slow_consumer","message":"m","conversation_id":"c","last_seq":3}'


def test_a_quota_error_frame_names_quota_scope_and_reset_and_decodes_back() -> None:
    frame = ErrorFrame(code=ErrorCode.QUOTA_EXCEEDED, message="m", id="u1", quota="turns_per_minute",
                       scope="user", resets_at="2023-11-14T22:14:00Z")
    data = encode_frame(frame)
    assert data == (b'{"type":"error","code":"quota_exceeded","message":"m","id":"u1","quota":"turns_per_minute",'
                    b'"scope":"user","resets_at":"2023-11-14T22:14:00Z"}')
    assert decode_server_frame(data) == frame


# -- the Meter over a real store, on a hand-driven clock -------------------------------------------------


@pytest.fixture
async def store() -> Any:
    s = SqliteStore(":memory:")
    await s.open()
    yield s
    await s.close()


async def test_turns_per_minute_refuse_at_the_limit_then_reset_with_the_window(store: SqliteStore) -> None:
    clock = Clock()
    meter = Meter(store, QuotaLimits({(Quota.TURNS_PER_MINUTE, Scope.USER): 2}), clock)
    await meter.admit_turn(ALICE)
    await meter.admit_turn(ALICE)
    with pytest.raises(QuotaExceeded) as refused:
        await meter.admit_turn(ALICE)
    assert refused.value.resets_at == window_start(60, clock.now) + 60
    await meter.admit_turn(BOB)                       # another user of the tenant: a counter of his own
    clock.now = refused.value.resets_at - 0.001
    with pytest.raises(QuotaExceeded):
        await meter.admit_turn(ALICE)                 # the same window to its last instant
    clock.now = refused.value.resets_at
    await meter.admit_turn(ALICE)                     # the next window


async def test_a_refused_tenant_charge_leaves_the_user_counter_untouched(store: SqliteStore) -> None:
    meter = Meter(store, QuotaLimits({(Quota.TURNS_PER_MINUTE, Scope.TENANT): 1}), Clock())
    await meter.admit_turn(ALICE)
    with pytest.raises(QuotaExceeded) as refused:
        await meter.admit_turn(BOB)
    assert refused.value.scope is Scope.TENANT
    user, _ = turn_charges(QuotaLimits(), BOB, T0)
    assert await store.quota_counts([user.counter]) == [0]   # all or nothing
    await meter.admit_turn(EVE)                             # another tenant: unaffected


async def test_a_slot_is_held_once_and_released_once(store: SqliteStore) -> None:
    meter = Meter(store, QuotaLimits({(Quota.CONCURRENT_TURNS, Scope.USER): 1}), Clock())
    await meter.take_slot(ALICE, "c1")
    await meter.take_slot(ALICE, "c1")                # held already: kept, not charged twice
    with pytest.raises(QuotaExceeded) as refused:
        await meter.take_slot(ALICE, "c2")
    assert (refused.value.quota, refused.value.scope, refused.value.resets_at) == (Quota.CONCURRENT_TURNS, Scope.USER, None)
    assert await meter.holds_slot("c1") and not await meter.holds_slot("c2")
    assert await meter.release_slot(ALICE, "c1")
    assert not await meter.release_slot(ALICE, "c1")  # given back once
    await meter.take_slot(ALICE, "c2")


async def test_tokens_are_counted_past_the_limit_and_refuse_the_next_turn_until_the_day_ends(store: SqliteStore) -> None:
    clock = Clock()
    meter = Meter(store, QuotaLimits({(Quota.TOKENS_PER_DAY, Scope.USER): 100}), clock)
    await meter.charge_tokens(ALICE, 60)
    await meter.admit_turn(ALICE)
    await meter.charge_tokens(ALICE, 60)              # over: counted all the same (Charged.AFTER)
    with pytest.raises(QuotaExceeded) as refused:
        await meter.admit_turn(ALICE)
    assert refused.value.quota is Quota.TOKENS_PER_DAY
    assert await meter.tenant_usage() == [TenantUsage("acme", "tokens_per_day", 120),
                                          TenantUsage("acme", "turns_per_minute", 1)]
    clock.now = refused.value.resets_at or 0.0
    await meter.admit_turn(ALICE)


async def test_windows_long_over_are_pruned(store: SqliteStore) -> None:
    clock = Clock()
    meter = Meter(store, QuotaLimits(), clock)
    await meter.admit_turn(ALICE)
    await meter.open_conversation(ALICE)
    clock.now += 3 * 86_400
    assert await meter.prune() == 2                   # the user's and the tenant's minute; gauges stay
    assert await meter.tenant_usage() == [TenantUsage("acme", "open_conversations", 1)]


# -- the tool-calls-per-turn backstop, in a conversation ----------------------------------------------


async def test_calls_past_the_turns_tool_calls_get_quota_exceeded_and_the_model_still_answers() -> None:
    h = harness(rounds_script(
        tool_round("demo.clock"),
        text_round(thinking("Two more."), action(call("demo.clock")), action(call("demo.weather", city="Paris"))),
        text_round(thinking("Done."), action(complete("It is noon."))),
    ))
    h.conv.runtime.quotas = QuotaLimits({(Quota.TOOL_CALLS_PER_TURN, Scope.TURN): 2})
    done = await h.turn("time?")
    assert (done["reason"], done["final_answer"]) == ("complete", "It is noon.")
    results = [e.data for e in h.events if e.event == "tool.result"]
    assert [(r.tool_id, r.ok, r.error) for r in results] == [
        ("demo.clock", True, None), ("demo.weather", False, "quota_exceeded"), ("demo.clock", True, None)]
    assert results[1].detail == {"quota": "tool_calls_per_turn", "limit": 2,
                                 "message": "this turn already ran its 2 tool calls: answer with what you have"}
    assert results[1].duration_ms == 0              # never run


async def test_the_next_turn_starts_with_a_fresh_tool_call_count() -> None:
    h = harness(rounds_script(tool_round("demo.clock"), text_round(thinking("Done."), action(complete("Noon."))),
                              loop=True))
    h.conv.runtime.quotas = QuotaLimits({(Quota.TOOL_CALLS_PER_TURN, Scope.TURN): 1})
    await h.turn("one")
    await h.turn("two")
    assert [e.data.ok for e in h.events if e.event == "tool.result"] == [True, True]


# -- usage: what the scripted model and mock-llm report, through LiteLLM ---------------------------------


USAGE_SCRIPT = {"loop": True, "rounds": [
    {"text": "<channel:thinking>hi</channel:thinking>", "usage": {"prompt_tokens": 120, "completion_tokens": 30}},
    {"text": "x" * 10},                                   # no usage given: its characters, 4 per token
]}


async def _finished(model: str, *, include_usage: bool, **kwargs: Any) -> Any:
    calls = iter(range(100))
    items = [item async for item in stream_model(
        [model], [{"role": "user", "content": "y" * 8}], conversation_id="usage", next_call_index=lambda: next(calls),
        include_usage=include_usage, **kwargs)]
    assert type(items[-1]) is ModelFinished
    return items[-1].usage


async def test_the_scripted_model_reports_usage_only_when_asked() -> None:
    model = script_model(parse_script(USAGE_SCRIPT))
    assert await _finished(model, include_usage=False) is None
    assert await _finished(model, include_usage=True) == Usage(120, 30)


async def test_mock_llm_reports_usage_after_the_finish_chunk_when_asked() -> None:
    runner, port = await start_mock_server(parse_script(USAGE_SCRIPT))
    try:
        endpoint = {"api_base": f"http://127.0.0.1:{port}/v1", "api_key": "unused"}
        assert await _finished("openai/mock", include_usage=True, **endpoint) == Usage(120, 30)
        assert await _finished("openai/mock", include_usage=False, **endpoint) is None
    finally:
        await runner.cleanup()


def test_a_round_without_usage_reports_its_characters() -> None:
    round_ = parse_script(USAGE_SCRIPT).rounds[1]
    assert round_.reported_usage([{"role": "user", "content": "y" * 9}]) == RoundUsage(prompt_tokens=3, completion_tokens=3)
