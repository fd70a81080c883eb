"""gateway/limits.py: the per-connection token bucket and bad-frame counter, on a hand-driven clock."""

from __future__ import annotations

import pytest

from gateway.limits import BadFrameCounter, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_refuses() -> None:
    bucket = TokenBucket(rate=20, burst=50, clock=Clock())
    assert all(bucket.take() for _ in range(50))
    assert not bucket.take()


def test_bucket_refills_at_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=20, burst=50, clock=clock)
    for _ in range(50):
        bucket.take()
    clock.now += 0.5  # 10 tokens
    assert sum(bucket.take() for _ in range(20)) == 10


def test_bucket_never_saves_more_than_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=20, burst=5, clock=clock)
    clock.now += 3600
    assert sum(bucket.take() for _ in range(100)) == 5


def test_a_refused_frame_costs_nothing() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=1, burst=1, clock=clock)
    assert bucket.take()
    assert not bucket.take() and not bucket.take()
    clock.now += 1
    assert bucket.take()


def test_a_clock_going_backwards_adds_nothing() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=1, clock=clock)
    assert bucket.take()
    clock.now -= 5
    assert not bucket.take()


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (1, 0), (-1, 5)])
def test_bucket_rejects_nonpositive_limits(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=burst)


def test_bad_frames_close_at_the_limit_in_a_row() -> None:
    counter = BadFrameCounter(10)
    assert [counter.bad() for _ in range(10)] == [False] * 9 + [True]


def test_a_good_frame_resets_the_count() -> None:
    counter = BadFrameCounter(3)
    counter.bad()
    counter.bad()
    counter.good()
    assert [counter.bad() for _ in range(3)] == [False, False, True]
