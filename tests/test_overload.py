"""gateway/overload.py: when a replica counts as late, from its two signals fed by hand."""

from __future__ import annotations

from gateway.overload import CLEAR_SHARE, LATE_SHARE, MIN_EVENTS, SMOOTHING, Overload

LAG, DELIVERY = 0.1, 0.25


def overload() -> Overload:
    return Overload(lag_limit_s=LAG, delivery_limit_s=DELIVERY)


def probe_with(o: Overload, on_time: int, late: int, loop_late_s: float = 0.0) -> None:
    for _ in range(on_time):
        o.arrived(DELIVERY / 2)
    for _ in range(late):
        o.arrived(DELIVERY * 2)
    o.probe(loop_late_s)


# -- the loop's lateness ----------------------------------------------------------------------

def test_one_probe_far_over_the_lag_limit_overloads() -> None:
    o = overload()
    o.probe(LAG / SMOOTHING)
    assert o.overloaded
    assert o.refusal() == "overloaded: this replica is late (its event loop runs 100 ms late); retry after 1 s\n"


def test_a_probe_just_over_the_lag_limit_is_smoothed_away() -> None:
    o = overload()
    o.probe(LAG * 1.5)
    assert not o.overloaded and 0 < o.lag.value < LAG


def test_a_lag_that_stays_over_the_limit_overloads() -> None:
    o = overload()
    for _ in range(20):
        o.probe(LAG * 1.5)
    assert o.overloaded


def test_overloaded_until_the_lag_falls_under_half_the_limit() -> None:
    o = overload()
    o.probe(1.0)
    states = []
    for _ in range(20):
        o.probe(0.0)
        states.append((o.overloaded, o.lag.value >= LAG * CLEAR_SHARE))
    # between half the limit and the limit it stays refused; it clears on the first probe under half
    assert all(overloaded == over_half for overloaded, over_half in states)
    assert states[0] == (True, True) and states[-1] == (False, False)


def test_a_lag_between_half_and_the_whole_limit_keeps_the_state() -> None:
    calm, busy = overload(), overload()
    busy.probe(1.0)
    for o in (calm, busy):
        for _ in range(50):
            o.probe(LAG * 0.7)
    assert not calm.overloaded and busy.overloaded


def test_a_timer_early_counts_as_on_time() -> None:
    o = overload()
    o.probe(-3.0)
    assert o.lag.value == 0.0


# -- late live events -------------------------------------------------------------------------

def test_a_late_share_over_the_limit_overloads_with_the_loop_on_time() -> None:
    o = overload()
    for _ in range(30):
        probe_with(o, on_time=80, late=20)       # 20% late, the loop on time
    assert o.overloaded and o.lag.value == 0.0
    assert o.refusal().startswith("overloaded: this replica is late (20% of its events arrive later than 250 ms)")


def test_a_late_share_under_the_limit_is_not_overload() -> None:
    o = overload()
    for _ in range(50):
        probe_with(o, on_time=97, late=3)        # 3% late: under LATE_SHARE
    assert LATE_SHARE * CLEAR_SHARE < o.late.value < LATE_SHARE and not o.overloaded


def test_a_trickle_of_late_events_is_not_load() -> None:
    """A few conversations, all of them late (one slow model, one slow store call): too few events to
    make a share, so the replica is not refused for them."""
    o = overload()
    for _ in range(50):
        probe_with(o, on_time=0, late=int(MIN_EVENTS) - 1)
    assert not o.overloaded


def test_the_late_share_clears_under_half_its_limit_and_when_traffic_stops() -> None:
    o = overload()
    for _ in range(10):
        probe_with(o, on_time=50, late=50)
    assert o.overloaded
    probe_with(o, on_time=100, late=0)
    assert o.overloaded                          # one probe on time: still over half the limit
    for _ in range(30):
        o.probe(0.0)                             # nothing arrives: nothing is late
    assert not o.overloaded and o.late.value < LATE_SHARE * CLEAR_SHARE


def test_limits_zero_never_overload_but_measure() -> None:
    o = Overload(lag_limit_s=0, delivery_limit_s=0)
    for _ in range(10):
        probe_with(o, on_time=0, late=100, loop_late_s=5.0)
    assert not o.overloaded
    assert o.lag.value > 1.0
