"""Store outages, without a store (docs/design.md#store-outage): the retry rule, one caller's
backoff, what a store tells of its health, and how it looks whether it is back. Sans-I/O: a clock
is a list the test moves; the store's own classification of its errors is tested with the stores
(tests/test_store_contract.py), the event log's waiting in tests/test_eventlog.py and a host's in
tests/test_store_outage_host.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from actors.store.base import StoreHealth, StoreStats, StoreUnavailable
from actors.store.outage import (
    BATCH,
    DISK_FULL,
    Backoff,
    HealthTracker,
    Prober,
    RetryRule,
    retry_unavailable,
)


def test_the_batch_rule_doubles_from_50_ms_to_2_s() -> None:
    assert [BATCH.delay(n) for n in range(1, 9)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_backoff_cuts_its_last_wait_at_the_ceiling_then_gives_up() -> None:
    backoff = Backoff(RetryRule(1.0, 2.0, 8.0), started=100.0, ceiling_s=10.0)
    assert backoff.failed(100.0, "connection lost") == 1.0
    assert backoff.failed(101.0, "connection lost") == 2.0
    assert backoff.failed(103.0, "failover") == 4.0 and backoff.retry_after_ms == 4000
    assert backoff.failed(107.0, "failover") == 3.0       # 8 s would pass the ceiling: the last try at 110
    assert backoff.failed(110.0, "failover") is None
    assert backoff.unavailable().cause == "failover"


def test_a_backoff_without_a_ceiling_never_gives_up() -> None:
    backoff = Backoff(RetryRule(0.5, 2.0, 5.0), started=0.0)
    assert [backoff.failed(t, "x") for t in (0.0, 1e3, 1e6, 1e9)] == [0.5, 1.0, 2.0, 4.0]


def test_health_logs_one_warning_per_outage_and_one_info_at_its_end(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    stats = StoreStats()
    tracker = HealthTracker(stats, clock=lambda: 1.7e9 + now[0], monotonic=lambda: now[0])
    assert tracker.health() == StoreHealth(True)
    with caplog.at_level(logging.INFO, logger="reactgate.store"):
        assert tracker.failed(StoreUnavailable(DISK_FULL), write=True, detail="database or disk is full (/srv/x.db)")
        now[0] += 3
        assert not tracker.failed(StoreUnavailable(DISK_FULL), write=True)        # the same outage
        assert not tracker.succeeded(write=False)  # reads go on during a full disk: it is not over
        assert tracker.health() == StoreHealth(False, 1.7e9 + 1000.0, DISK_FULL)
        now[0] += 2
        assert tracker.succeeded(write=True)
        assert not tracker.succeeded(write=True)
    assert tracker.health() == StoreHealth(True)
    assert (stats.outages, stats.unavailable, stats.unavailable_seconds) == (1, 2, 5.0)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", "the disk is full: database or disk is full (/srv/x.db); the conversation waits until space is freed"),
        ("INFO", "store available again after 5.0 s (it was: disk full)"),
    ]


async def test_retry_unavailable_tries_again_then_gives_up_at_its_ceiling() -> None:
    tries: list[int] = []

    async def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise StoreUnavailable("failover")
        return "done"

    assert await retry_unavailable(flaky, rule=RetryRule(0.01, 1.0, 0.01)) == "done" and len(tries) == 3

    async def down() -> None:
        raise StoreUnavailable("failover")

    with pytest.raises(StoreUnavailable):
        await retry_unavailable(down, ceiling_s=0.05, rule=RetryRule(0.01, 1.0, 0.01))


async def test_a_prober_looks_until_the_store_is_back_unless_traffic_tells() -> None:
    stats = StoreStats()
    tracker = HealthTracker(stats)
    looks: list[bool] = []
    back = asyncio.Event()

    async def probe() -> None:                 # what the store's boundary does with a probe's answer
        looks.append(True)
        if back.is_set():
            tracker.succeeded(write=True)
        else:
            tracker.failed(StoreUnavailable("connection lost"), write=True)

    prober = Prober(tracker, probe, RetryRule(0.01, 1.0, 0.01))
    tracker.failed(StoreUnavailable("connection lost"), write=True)
    prober.start()
    async with asyncio.timeout(5):
        while len(looks) < 3:
            await asyncio.sleep(0.005)
    tracker.succeeded(write=False)             # reads answered: no look is skipped for them (a write outage)
    back.set()
    async with asyncio.timeout(5):
        while tracker.down:
            await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    assert tracker.health() == StoreHealth(True) and stats.outages == 1
    count = len(looks)
    await asyncio.sleep(0.05)
    assert len(looks) == count                 # once it is back, nobody looks any more
    await prober.stop()


async def test_a_prober_skips_its_look_while_the_stores_own_writes_tell() -> None:
    tracker = HealthTracker(StoreStats())
    looks: list[bool] = []

    async def probe() -> None:
        looks.append(True)

    prober = Prober(tracker, probe, RetryRule(0.02, 1.0, 0.02))
    tracker.failed(StoreUnavailable("failover"), write=True)
    prober.start()
    for _ in range(10):                        # an event log trying again keeps answering
        tracker.failed(StoreUnavailable("failover"), write=True)
        await asyncio.sleep(0.01)
    assert looks == []
    await prober.stop()
