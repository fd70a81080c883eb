"""gateway/overload.py: the loop's smoothed lateness and when a replica counts as overloaded, fed by hand."""

from __future__ import annotations

from gateway.overload import CLEAR_SHARE, SMOOTHING, LoopLag


def test_one_probe_far_over_the_limit_overloads() -> None:
    lag = LoopLag(limit_s=0.1)
    lag.observe(0.1 / SMOOTHING)
    assert lag.overloaded
    assert "overloaded: this replica's event loop runs 100 ms late" in lag.refusal()


def test_a_probe_just_over_the_limit_is_smoothed_away() -> None:
    lag = LoopLag(limit_s=0.1)
    lag.observe(0.15)
    assert not lag.overloaded and 0 < lag.lag_s < 0.1


def test_a_lag_that_stays_over_the_limit_overloads() -> None:
    lag = LoopLag(limit_s=0.1)
    for _ in range(20):
        lag.observe(0.15)
    assert lag.overloaded


def test_overloaded_until_the_lag_falls_under_half_the_limit() -> None:
    lag = LoopLag(limit_s=0.1)
    lag.observe(1.0)
    states = []
    for _ in range(20):
        lag.observe(0.0)
        states.append((lag.overloaded, lag.lag_s >= 0.1 * CLEAR_SHARE))
    # between half the limit and the limit it stays refused; it clears on the first probe under half
    assert all(overloaded == over_half for overloaded, over_half in states)
    assert states[0] == (True, True) and states[-1] == (False, False)


def test_a_lag_between_half_and_the_whole_limit_keeps_the_state() -> None:
    calm, busy = LoopLag(limit_s=0.1), LoopLag(limit_s=0.1)
    busy.observe(1.0)
    for lag in (calm, busy):
        for _ in range(50):
            lag.observe(0.07)
    assert not calm.overloaded and busy.overloaded


def test_limit_zero_never_overloads_but_measures() -> None:
    lag = LoopLag(limit_s=0)
    lag.observe(5.0)
    assert not lag.overloaded and lag.lag_s > 1.0


def test_a_timer_early_counts_as_on_time() -> None:
    lag = LoopLag(limit_s=0.1)
    lag.observe(-3.0)
    assert lag.lag_s == 0.0
