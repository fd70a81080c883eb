"""Placement: rendezvous hashing over live hosts and the single-activation table (docs/design.md#placement)."""

from __future__ import annotations

import pytest

from actors.hosting.placement import NoLiveHost, PlacementTable, rendezvous_pick

HOSTS = ["h0", "h1", "h2"]
CONVERSATIONS = [f"c{i}" for i in range(300)]


def table(*hosts: str) -> PlacementTable:
    t = PlacementTable()
    for h in hosts:
        t.add_host(h)
    return t


def test_placement_spreads_conversations_over_every_host() -> None:
    t = table(*HOSTS)
    load = {h: 0 for h in HOSTS}
    for cid in CONVERSATIONS:
        load[t.place(cid)] += 1
    assert all(count > 50 for count in load.values())


def test_a_host_death_moves_only_its_own_conversations() -> None:
    t = table(*HOSTS)
    before = {cid: t.place(cid) for cid in CONVERSATIONS}
    moved = set(t.host_failed("h1"))
    after = {cid: t.place(cid) for cid in CONVERSATIONS}
    assert moved == {cid for cid, h in before.items() if h == "h1"}
    assert all(after[cid] == before[cid] for cid in CONVERSATIONS if cid not in moved)
    assert all(after[cid] != "h1" for cid in moved)


def test_rendezvous_pick_does_not_depend_on_host_order() -> None:
    assert all(rendezvous_pick(c, HOSTS) == rendezvous_pick(c, list(reversed(HOSTS))) for c in CONVERSATIONS)


def test_claim_grants_one_activation_and_refuses_a_second_host() -> None:
    t = table(*HOSTS)
    assert t.claim("c", "h2") == "h2"
    assert t.claim("c", "h0") == "h2"   # the holder, not the asker
    assert t.place("c") == "h2"


def test_release_lets_the_next_claim_win_anywhere() -> None:
    t = table(*HOSTS)
    t.claim("c", "h2")
    t.release("c", "h2")
    assert t.claim("c", "h0") == "h0"


def test_a_dead_holder_loses_its_claim() -> None:
    t = table(*HOSTS)
    t.claim("c", "h2")
    t.host_failed("h2")
    assert t.claim("c", "h1") == "h1"


def test_dedicated_hosts_are_never_placement_candidates() -> None:
    t = table("h0")
    t.claim("own", "conv-own", dedicated=True)
    assert t.place("own") == "conv-own"
    assert {t.place(cid) for cid in CONVERSATIONS} == {"h0"}


def test_no_live_host_is_an_error() -> None:
    with pytest.raises(NoLiveHost):
        PlacementTable().place("c")


def test_assigning_a_dedicated_host_takes_the_conversation_from_any_holder() -> None:
    t = table("h0")
    t.claim("own", "h0")
    t.assign("own", "conv-own", dedicated=True)
    assert t.place("own") == "conv-own"
    assert t.claim("own", "h0") == "conv-own"   # the dedicated host now holds the single activation
    assert "conv-own" not in t.live             # and is never a candidate for another conversation


# -- generations: a replaced configuration's hosts drain (docs/design.md#generations) ----------------


def test_a_draining_host_keeps_what_it_holds_and_is_never_picked_again() -> None:
    table = PlacementTable()
    table.add_host("old-0")
    held = table.place("c-held")
    assert held == "old-0"
    table.add_host("new-0")
    table.drain("old-0")
    assert table.place("c-held") == "old-0"            # a turn in flight finishes where it runs
    assert table.claim("c-held", "new-0") == "old-0"   # single activation: never in two generations
    assert {table.place(f"c-{i}") for i in range(50)} == {"new-0"}
    table.add_host("old-0")                            # a heartbeat does not make it a candidate again
    assert table.place("c-fresh") == "new-0"
    assert table.load() == {"new-0": 51}


def test_a_draining_host_is_refused_a_new_activation_and_told_where_it_goes() -> None:
    table = PlacementTable()
    table.add_host("old-0")
    table.add_host("new-0")
    table.drain("old-0")
    assert table.claim("c-1", "old-0") == "new-0"
    assert table.assigned["c-1"] == "new-0"


def test_a_conversation_released_by_a_draining_host_moves_to_the_current_generation() -> None:
    table = PlacementTable()
    table.add_host("old-0")
    table.place("c-1")
    table.add_host("new-0")
    table.add_host("new-1")
    table.drain("old-0")
    table.release("c-1", "old-0")
    assert table.place("c-1") in {"new-0", "new-1"}
    assert table.host_failed("old-0") == []
    assert not table.alive("old-0")


def test_ray_actor_options_ask_for_a_sliver_of_the_actor_resource_only_when_one_is_named() -> None:
    from actors.ray.names import placement

    assert placement(None) == {}
    assert placement("reactgate_actors") == {"resources": {"reactgate_actors": 0.001}}
