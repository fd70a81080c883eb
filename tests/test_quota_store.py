"""The Store contract for quota counters (docs/design.md#quotas), on every backend: SQLite (a file
and :memory:) and PostgreSQL, made as the store contract makes them (tests/test_store_contract.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from actors.quotas import QuotaCharge, QuotaCounter
from actors.store import Store
from tests.test_store_contract import BACKENDS, DURABLE_BACKENDS, StoreFactory, _factory


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    factory, cleanup = _factory(request, tmp_path)
    s = factory()
    await s.open()
    yield s
    await s.close()
    cleanup()


@pytest.fixture(params=DURABLE_BACKENDS)
def make_durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    factory, cleanup = _factory(request, tmp_path)
    yield factory
    cleanup()


MINUTE = QuotaCounter("user", "4:acme:alice", "turns_per_minute", 1_700_000_000 - 20)
TENANT = QuotaCounter("tenant", "acme", "turns_per_minute", 1_700_000_000 - 20)
GAUGE = QuotaCounter("tenant", "acme", "open_conversations", 0)
LEASE = QuotaCounter("conversation", "c_1", "concurrent_turns", 0)


async def test_a_counter_never_charged_counts_zero(store: Store) -> None:
    assert await store.quota_counts([MINUTE, GAUGE]) == [0, 0]


async def test_charges_apply_up_to_the_limit_and_the_next_is_refused(store: Store) -> None:
    assert await store.charge_quota([QuotaCharge(MINUTE, 1, 2)]) is None
    assert await store.charge_quota([QuotaCharge(MINUTE, 1, 2)]) is None
    assert await store.charge_quota([QuotaCharge(MINUTE, 1, 2)]) == 0
    assert await store.quota_counts([MINUTE]) == [2]


async def test_a_charge_is_all_or_nothing_and_names_the_refused_counter(store: Store) -> None:
    assert await store.charge_quota([QuotaCharge(TENANT, 1, 1)]) is None
    assert await store.charge_quota([QuotaCharge(MINUTE, 1, 5), QuotaCharge(TENANT, 1, 1)]) == 1
    assert await store.quota_counts([MINUTE, TENANT]) == [0, 1]      # the user's charge was taken back


async def test_an_amount_over_the_limit_is_refused_even_on_a_fresh_counter(store: Store) -> None:
    assert await store.charge_quota([QuotaCharge(MINUTE, 3, 2)]) == 0
    assert await store.quota_counts([MINUTE]) == [0]


async def test_a_charge_without_a_limit_always_counts(store: Store) -> None:
    for amount in (500, 700):
        assert await store.charge_quota([QuotaCharge(GAUGE, amount)]) is None
    assert await store.quota_counts([GAUGE]) == [1200]


async def test_concurrent_charges_admit_exactly_the_limit(store: Store) -> None:
    outcomes = await asyncio.gather(*(store.charge_quota([QuotaCharge(MINUTE, 1, 5)]) for _ in range(20)))
    assert outcomes.count(None) == 5 and await store.quota_counts([MINUTE]) == [5]


async def test_concurrent_charges_through_two_store_objects_admit_exactly_the_limit(
    make_durable_store: StoreFactory,
) -> None:
    a, b = make_durable_store(), make_durable_store()      # two processes sharing one database
    await a.open()
    await b.open()
    try:
        outcomes = await asyncio.gather(*(s.charge_quota([QuotaCharge(MINUTE, 1, 7), QuotaCharge(TENANT, 1, 9)])
                                          for _ in range(10) for s in (a, b)))
        assert outcomes.count(None) == 7
        assert await a.quota_counts([MINUTE, TENANT]) == [7, 7]
    finally:
        await a.close()
        await b.close()


async def test_a_release_gives_back_and_never_goes_below_zero(store: Store) -> None:
    await store.charge_quota([QuotaCharge(GAUGE, 2)])
    assert await store.release_quota(None, [QuotaCharge(GAUGE, 1)])
    assert await store.quota_counts([GAUGE]) == [1]
    assert await store.release_quota(None, [QuotaCharge(GAUGE, 5), QuotaCharge(MINUTE, 1)])
    assert await store.quota_counts([GAUGE, MINUTE]) == [0, 0]


async def test_a_release_through_its_lease_happens_once(store: Store) -> None:
    assert await store.charge_quota([QuotaCharge(LEASE, 1, 1), QuotaCharge(GAUGE, 1, 3)]) is None
    assert await store.charge_quota([QuotaCharge(LEASE, 1, 1), QuotaCharge(GAUGE, 1, 3)]) == 0  # held already
    assert await store.release_quota(LEASE, [QuotaCharge(GAUGE, 1)])
    assert not await store.release_quota(LEASE, [QuotaCharge(GAUGE, 1)])
    assert await store.quota_counts([LEASE, GAUGE]) == [0, 0]


async def test_quota_rows_list_a_scopes_gauges_and_the_windows_since(store: Store) -> None:
    old = TENANT._replace(window_start=TENANT.window_start - 60)
    for counter in (MINUTE, TENANT, old, GAUGE):
        await store.charge_quota([QuotaCharge(counter, 2)])
    rows = await store.quota_rows("tenant", TENANT.window_start)
    assert sorted(rows) == [("acme", "open_conversations", 0, 2), ("acme", "turns_per_minute", TENANT.window_start, 2)]


async def test_pruning_drops_windows_that_started_before_and_keeps_gauges(store: Store) -> None:
    old = TENANT._replace(window_start=TENANT.window_start - 60)
    for counter in (TENANT, old, GAUGE, LEASE):
        await store.charge_quota([QuotaCharge(counter, 1)])
    assert await store.prune_quota(TENANT.window_start) == 1
    assert await store.quota_counts([TENANT, old, GAUGE, LEASE]) == [1, 0, 1, 1]


async def test_a_forgotten_key_is_new_again(store: Store) -> None:
    assert await store.remember_key("c1", "m1", 1.0)
    await store.forget_key("c1", "m1")
    assert await store.remember_key("c1", "m1", 2.0)
    assert not await store.remember_key("c1", "m1", 3.0)


async def test_counters_survive_reopening_the_store(make_durable_store: StoreFactory) -> None:
    first = make_durable_store()
    await first.open()
    await first.charge_quota([QuotaCharge(MINUTE, 1, 1), QuotaCharge(LEASE, 1, 1)])
    await first.close()
    again = make_durable_store()
    await again.open()
    try:
        assert await again.charge_quota([QuotaCharge(MINUTE, 1, 1)]) == 0     # still at its limit
        assert await again.quota_counts([MINUTE, LEASE]) == [1, 1]
    finally:
        await again.close()
