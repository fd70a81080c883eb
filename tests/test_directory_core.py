"""The Directory's decisions, without Ray (docs/design.md#placement, #host-death, #generations).

`DirectoryCore` answers each call with effects; the Directory actor carries them out. Host handles
are opaque to the core: plain strings here.
"""

from __future__ import annotations

import pytest

from actors.hosting.backend import ConfigurationReplaced
from actors.hosting.placement import NoLiveHost
from actors.ray.config import RayConfig
from actors.ray.directory_core import (
    Adopt,
    DirectoryCore,
    Drain,
    HandOver,
    Registration,
    RemoveToolPool,
    ReplaceHost,
    Retire,
    StartHost,
    Undrain,
    WatchLifeline,
)
from actors.ray.names import dedicated_host, sharded_host
from actors.tools.registry import ToolRegistry

CIDS = [f"c{i}" for i in range(40)]


def config(store: str, hosts: int = 2) -> RayConfig:
    """A configuration whose generation is set by `store`."""
    return RayConfig(store_url=f"sqlite:///{store}.sqlite3", registry=ToolRegistry(), profiles={}, hosts=hosts)


A, B = config("a"), config("b")
A0, A1 = sharded_host(A.generation, 0), sharded_host(A.generation, 1)
B0 = sharded_host(B.generation, 0)


def started(cfg: RayConfig = A, *hosts: str) -> DirectoryCore:
    """A Directory whose gateway made `cfg` current, with `hosts` registered (default: cfg's sharded hosts)."""
    core = DirectoryCore()
    names, _ = core.ensure_hosts(cfg.hosts, cfg)
    for name in hosts or names:
        core.register(name, f"{name}/1", f"handle {name}/1", fresh=True)
    return core


def placed(core: DirectoryCore, cids: list[str] = CIDS) -> dict[str, str]:
    return {cid: core.place(cid) for cid in cids}


# -- registration, heartbeats, incarnations ----------------------------------------------------------


def test_a_registered_host_is_placed_on_and_its_lifeline_held() -> None:
    core = DirectoryCore()
    core.ensure_hosts(1, A)
    registration, effects = core.register(A0, "i1", "h", fresh=True)
    assert registration == Registration(known=True, wants_config=False)
    assert effects == [WatchLifeline(A0, "i1", "h")]
    assert core.hosts() == [A0]
    assert core.place("c") == A0
    assert core.handle(A0) == "h"


def test_a_heartbeat_of_the_registered_incarnation_changes_nothing() -> None:
    core = started(A, A0)
    assert core.register(A0, f"{A0}/1", "other handle", fresh=False) == (Registration(True, False), [])
    assert core.handle(A0) == f"handle {A0}/1"


def test_a_restarted_directory_asks_an_unknown_host_to_reclaim_and_for_its_configuration() -> None:
    core = DirectoryCore()
    registration, effects = core.register(A0, "i1", "h", fresh=False)
    assert registration == Registration(known=False, wants_config=True)
    assert effects == [WatchLifeline(A0, "i1", "h")]
    assert core.reclaim(A0, "i1", ["c1", "c2"]) == []
    assert (core.holder("c1"), core.holder("c2")) == (A0, A0)
    assert core.configure(A) == []
    assert core.generation == A.generation
    assert core.register(A0, "i1", "h", fresh=False)[0] == Registration(known=True, wants_config=False)


def test_a_reclaim_answers_the_conversations_another_live_host_holds() -> None:
    core = started(A, A0, A1)
    assert core.claim("c1", A1) == A1
    assert core.reclaim(A0, f"{A0}/1", ["c1", "c2"]) == ["c1"]
    assert (core.holder("c1"), core.holder("c2")) == (A1, A0)


def test_a_reclaim_by_a_stale_incarnation_is_ignored() -> None:
    core = started(A, A0)
    assert core.reclaim(A0, "an older one", ["c1"]) == []
    assert core.holder("c1") is None


def test_the_configuration_is_taken_only_by_a_directory_without_one() -> None:
    core = started(A)
    assert core.configure(B) == []
    assert core.generation == A.generation


def test_a_new_incarnation_under_a_registered_name_counts_as_the_old_ones_death() -> None:
    core = started(A, A0)
    before = placed(core, ["c1", "c2"])
    registration, effects = core.register(A0, "i2", "h2", fresh=True)
    assert registration == Registration(known=True, wants_config=False)
    assert effects == [HandOver(), ReplaceHost(A0), WatchLifeline(A0, "i2", "h2"), HandOver()]
    assert core.orphans == {"c1": A0, "c2": A0}        # not left assigned to the name, where nothing activates them
    assert [core.holder(c) for c in before] == [None, None]
    assert core.replacement(A0) is None                # the new incarnation is the replacement
    assert core.is_current(A0, "i2") and not core.is_current(A0, f"{A0}/1")


def test_a_late_heartbeat_of_a_replaced_incarnation_is_ignored() -> None:
    core = started(A, A0)
    core.register(A0, "i2", "h2", fresh=True)
    assert core.register(A0, f"{A0}/1", "h1", fresh=False) == (Registration(True, False), [])
    assert core.is_current(A0, "i2")
    assert core.handle(A0) == "h2"


def test_a_stale_death_report_never_unregisters_a_newer_incarnation() -> None:
    core = started(A, A0)
    core.register(A0, "i2", "h2", fresh=True)
    assert core.died(A0, f"{A0}/1") == []
    assert core.hosts() == [A0]


# -- host death, orphans, hand-over --------------------------------------------------------------------


def test_a_dead_hosts_conversations_become_orphans_and_a_sharded_host_is_replaced() -> None:
    core = started(A)
    before = placed(core)
    effects = core.died(A1, f"{A1}/1")
    assert effects == [HandOver(), ReplaceHost(A1)]
    assert core.orphans == {cid: A1 for cid, host in before.items() if host == A1}
    assert all(core.holder(cid) == A0 for cid, host in before.items() if host == A0)  # a death moves only its own
    assert core.hosts() == [A0]
    assert core.handle(A1) is None
    assert core.replacement(A1) == StartHost(A1, A, A.host_num_cpus)
    assert core.died(A1, f"{A1}/1") == []             # reported twice: handled once


def test_a_host_beyond_the_wanted_count_is_not_replaced() -> None:
    core = started(config("a", hosts=1), A0, A1)       # A1 registered, though one host is wanted
    assert core.died(A1, f"{A1}/1") == []


def test_only_orphans_with_work_in_flight_are_placed_and_adopted_at_once() -> None:
    core = started(A)
    before = placed(core)
    core.died(A1, f"{A1}/1")
    asked = dict(core.orphans)
    busy = sorted(asked)[:2]
    assert core.checker() == A0
    assert core.handed_over(asked, busy) == [Adopt(A0, tuple(busy))]
    assert core.orphans == {}
    assert [core.holder(c) for c in busy] == [A0, A0]
    idle = [cid for cid in asked if cid not in busy]
    assert all(core.holder(cid) is None for cid in idle)  # placed by their next frame
    assert len(idle) == len([h for h in before.values() if h == A1]) - 2


def test_a_conversation_orphaned_again_by_another_death_during_the_check_stays_an_orphan() -> None:
    core = started(A)
    placed(core)
    on_a1 = next(cid for cid in CIDS if core.holder(cid) == A1)
    core.died(A1, f"{A1}/1")
    asked = dict(core.orphans)
    assert core.place(on_a1) == A0                     # its next frame placed it meanwhile
    core.died(A0, f"{A0}/1")                           # and that host died before the answer
    assert core.handed_over(asked, []) == []
    assert core.orphans[on_a1] == A0


def test_busy_orphans_wait_for_a_live_host() -> None:
    core = started(A)
    placed(core)
    core.died(A0, f"{A0}/1")
    core.died(A1, f"{A1}/1")
    assert core.checker() is None
    asked = dict(core.orphans)
    core.created(A0, "not registered")                  # a replacement that has not registered yet
    assert core.checker() is None
    assert core.handed_over(asked, sorted(asked)) == []  # no live host: nothing placed
    assert core.orphans == asked
    _, effects = core.register(A0, "i2", "h2", fresh=True)
    assert effects[-1] == HandOver()                    # a registration gives them a place
    assert core.checker() == A0


def test_the_in_flight_check_runs_on_a_sharded_host_before_a_dedicated_one() -> None:
    core = started(A, A1)
    name, _ = core.ensure_dedicated("d", A)
    core.register(name, "i", "h", fresh=True)
    assert core.checker() == A1
    core.died(A1, f"{A1}/1")
    assert core.checker() == name


def test_a_dead_dedicated_host_is_not_replaced_but_its_busy_conversation_gets_a_new_one() -> None:
    core = started(A)
    name, effects = core.ensure_dedicated("d", A)
    assert (name, effects) == (dedicated_host(A.generation, "d"), [StartHost(name, A, 0)])
    core.register(name, "i1", "h1", fresh=True)
    assert core.died(name, "i1") == [HandOver()]
    assert core.orphans == {"d": name}
    assert core.handed_over({"d": name}, ["d"]) == [StartHost(name, A, 0), Adopt(name, ("d",))]
    assert core.holder("d") == name
    assert core.hosts() == [A0, A1]                      # never a candidate for another conversation


def test_a_dedicated_orphan_waits_for_a_configuration_to_build_its_host_from() -> None:
    core = DirectoryCore()                               # restarted: no configuration yet
    name = dedicated_host(A.generation, "d")
    core.register(A0, "i0", "h0", fresh=False)
    core.register(name, "i1", "h1", fresh=False)
    core.reclaim(name, "i1", ["d"])
    core.died(name, "i1")
    assert core.handed_over({"d": name}, ["d"]) == []
    assert core.orphans == {"d": name}


def test_a_host_that_died_unregistered_before_adopting_hands_its_conversations_over_again() -> None:
    core = started(A)
    name, _ = core.ensure_dedicated("d", A)
    core.created(name, "h")
    assert not core.has_lifeline(name)
    assert core.vanished(name) == [HandOver()]
    assert core.orphans == {"d": name}
    assert core.holder("d") is None


def test_a_registered_host_that_dies_before_adopting_is_left_to_its_lifeline() -> None:
    core = started(A)
    assert core.has_lifeline(A0)


def test_adoptions_and_waiting_orphans_are_counted_for_operators() -> None:
    core = started(A)
    placed(core)
    core.died(A1, f"{A1}/1")
    waiting = len(core.orphans)
    core.adopted(2)
    assert core.handovers() == {"resumed": 2, "orphans": waiting}


# -- generations -----------------------------------------------------------------------------------------


def test_the_first_gateway_makes_its_generation_current_and_starts_its_hosts() -> None:
    core = DirectoryCore()
    names, effects = core.ensure_hosts(2, A)
    assert names == [A0, A1]
    assert effects == [StartHost(A0, A, A.host_num_cpus), StartHost(A1, A, A.host_num_cpus)]
    assert core.generation == A.generation


def test_a_gateway_of_the_current_generation_starts_only_hosts_not_registered() -> None:
    core = started(A, A0)
    assert core.ensure_hosts(2, A) == ([A0, A1], [StartHost(A1, A, A.host_num_cpus)])


def test_a_new_generation_drains_the_old_hosts_and_refuses_the_old_gateways() -> None:
    core = started(A)
    names, effects = core.ensure_hosts(1, B)
    assert names == [B0]
    assert effects == [Drain(A0), Drain(A1), StartHost(B0, B, B.host_num_cpus)]
    assert core.generation == B.generation
    with pytest.raises(ConfigurationReplaced) as refused:
        core.check(A.generation, A.sections)
    assert (refused.value.mine, refused.value.current, refused.value.changed) == (A.generation, B.generation, ("store",))
    with pytest.raises(ConfigurationReplaced):
        core.place("c", A.generation)
    core.check(B.generation)                              # the current one serves


def test_draining_hosts_keep_what_they_hold_and_are_never_picked() -> None:
    core = started(A)
    before = placed(core, ["c1"])
    core.ensure_hosts(1, B)
    assert core.place("c1") == before["c1"]               # its turn finishes where it runs
    assert core.hosts() == []
    with pytest.raises(NoLiveHost):
        core.place("c2")
    core.register(B0, "i", "h", fresh=True)
    assert core.place("c2") == B0


def test_a_claim_from_a_draining_host_is_redirected_to_a_current_one() -> None:
    core = started(A)
    core.ensure_hosts(1, B)
    core.register(B0, "i", "h", fresh=True)
    assert core.claim("c", A0) == B0
    assert core.holder("c") == B0


def test_a_rollback_makes_the_old_generation_current_again_and_undrains_its_hosts() -> None:
    core = started(A)
    core.ensure_hosts(1, B)
    core.register(B0, "i", "h", fresh=True)
    _, effects = core.ensure_hosts(2, A)
    assert effects == [Undrain(A0), Undrain(A1), Drain(B0)]
    assert core.generation == A.generation
    core.check(A.generation)
    with pytest.raises(ConfigurationReplaced):
        core.check(B.generation)
    assert core.hosts() == [A0, A1]


def test_a_draining_host_that_re_registers_with_a_restarted_directory_keeps_draining() -> None:
    core = DirectoryCore()
    core.configure(B)                                     # a current host's heartbeat came first
    _, effects = core.register(A0, "i", "h", fresh=False)
    assert effects == [Drain(A0), WatchLifeline(A0, "i", "h")]
    assert core.hosts() == []


def test_hosts_met_by_a_restarted_directory_drain_once_it_learns_the_current_generation() -> None:
    core = DirectoryCore()
    core.register(A0, "i", "h", fresh=False)
    core.register(B0, "j", "k", fresh=False)
    assert core.configure(B) == [Drain(A0)]
    assert core.hosts() == [B0]


def test_a_dead_host_of_a_replaced_generation_is_not_replaced() -> None:
    core = started(A, A0)
    core.ensure_hosts(1, B)
    assert core.died(A0, f"{A0}/1") == [RemoveToolPool(A.generation)]
    assert core.replacement(A0) is None


def test_a_dedicated_conversation_stays_on_its_draining_host_until_its_next_activation() -> None:
    core = started(A)
    old, _ = core.ensure_dedicated("d", A)
    core.register(old, "i", "h", fresh=True)
    assert core.ensure_dedicated("d", B) == (old, [Drain(A0), Drain(A1), Drain(old)])
    core.retire(old)                                      # drained: passivated, released, retired
    new, effects = core.ensure_dedicated("d", B)
    assert (new, effects) == (dedicated_host(B.generation, "d"), [StartHost(new, B, 0)])


# -- retirement ------------------------------------------------------------------------------------------


def test_a_retired_dedicated_host_is_forgotten_and_its_lifelines_failure_is_no_death() -> None:
    core = started(A)
    name, _ = core.ensure_dedicated("d", A)
    core.register(name, "i", "h", fresh=True)
    core.release("d", name)
    assert core.retire(name) == [Retire(name)]
    assert core.died(name, "i") == []
    assert core.orphans == {}
    assert core.handle(name) is None


def test_a_current_sharded_host_is_never_retired() -> None:
    core = started(A)
    assert core.retire(A0) == []
    assert core.hosts() == [A0, A1]


def test_the_last_drained_host_of_a_replaced_generation_takes_its_tool_pool_with_it() -> None:
    core = started(A)
    core.ensure_hosts(1, B)
    assert core.retire(A0) == [Retire(A0)]
    assert core.retire(A1) == [Retire(A1), RemoveToolPool(A.generation)]


def test_a_replaced_generation_with_no_host_left_loses_its_tool_pool_at_once() -> None:
    core = DirectoryCore()
    core.ensure_hosts(2, A)                               # none of its hosts registered
    _, effects = core.ensure_hosts(1, B)
    assert effects == [RemoveToolPool(A.generation), StartHost(B0, B, B.host_num_cpus)]
