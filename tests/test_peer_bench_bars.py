"""Issue 23's bars as bench/peer_bench.py judges them from a run's rows (`bars`): each verdict is the
bar's rule applied to the rows the run measured, at N = 300 or at the largest N both systems ran,
which the line then names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))   # as when a bench runs: its siblings import bare
from peer_bench import Row, bars, per_core

BAR_MS = 250.0


def row(system: str, users: int, us_per_chunk: float, p99_ms: float, *, lost: int = 0) -> Row:
    chunks = 10_000
    result = {"chunks": chunks, "turns": 50, "turns_failed": 0, "lat_p99_ms": p99_ms,
              "lost": lost, "dup": 0, "ooo": 0, "cut_lost": 0, "cut_dup": 0, "cut_ooo": 0}
    return Row(system, users, result, server_cpu_s=us_per_chunk * chunks / 1e6)


def verdicts(rows: list[Row], capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """{bar: "PASS …" / "FAIL …" / "- …"}, as printed, keyed by the bar's first words."""
    bars(rows, per_core(rows, sorted({r.system for r in rows}), BAR_MS), BAR_MS)
    printed = capsys.readouterr().out.split("issue 23's bars, in this run:\n")[1]
    lines = [line.strip() for line in printed.splitlines() if line.strip()]
    return {line.split(None, 1)[1].split(":")[0]: line for line in lines}


def test_each_bar_is_judged_from_the_rows_at_300(capsys: pytest.CaptureFixture[str]) -> None:
    got = verdicts([row("local", 300, 243, 218), row("ray", 300, 300, 240), row("relay", 300, 103, 6),
                    row("peer", 25, 1_566, 145)], capsys)
    assert got["local ≤ 100 µs per chunk at N = 300, p99 ≤ 250 ms"].startswith("FAIL")
    assert got["local ≤ 100 µs per chunk at N = 300, p99 ≤ 250 ms"].endswith("243 µs, p99 218 ms")
    assert got["ray ≤ 1.3× local"] == "PASS  ray ≤ 1.3× local: 1.23×"
    assert got["local ≤ 2× the relay"] == "FAIL  local ≤ 2× the relay: 2.36×"
    assert got["local ≥ 10× the peer's conversations per core, within the p99 bar"].endswith(": 6.4×")
    assert got["0 lost, duplicated or out of order, rejoins included"].startswith("PASS")


def test_bars_met_pass(capsys: pytest.CaptureFixture[str]) -> None:
    got = verdicts([row("local", 300, 95, 200), row("relay", 300, 50, 5), row("peer", 25, 1_000, 100)], capsys)
    assert got["local ≤ 100 µs per chunk at N = 300, p99 ≤ 250 ms"].startswith("PASS")
    assert got["local ≤ 2× the relay"].startswith("PASS")
    assert got["local ≥ 10× the peer's conversations per core, within the p99 bar"].startswith("PASS")


def test_a_comparison_without_n_300_is_made_at_the_largest_n_both_ran_and_says_so(
        capsys: pytest.CaptureFixture[str]) -> None:
    got = verdicts([row("local", 50, 468, 16), row("local", 100, 378, 20), row("ray", 50, 1_321, 151),
                    row("ray", 100, 754, 253)], capsys)
    assert got["ray ≤ 1.3× local"] == "FAIL  ray ≤ 1.3× local: 1.99× (at N = 100: not run at 300)"
    assert "local ≤ 100 µs per chunk at N = 300, p99 ≤ 250 ms" not in got   # local did not run at 300


def test_fast_but_late_is_not_within_the_bar(capsys: pytest.CaptureFixture[str]) -> None:
    got = verdicts([row("local", 300, 90, 400), row("peer", 25, 1_566, 145)], capsys)
    assert got["local ≤ 100 µs per chunk at N = 300, p99 ≤ 250 ms"].startswith("FAIL")
    peer = got["local ≥ 10× the peer's conversations per core, within the p99 bar"]
    assert peer.startswith("FAIL") and peer.endswith("local has no N within the bar")


def test_a_peer_never_within_the_bar_leaves_that_bar_undecided(capsys: pytest.CaptureFixture[str]) -> None:
    got = verdicts([row("local", 300, 90, 100), row("peer", 25, 1_566, 400)], capsys)
    assert got["local ≥ 10× the peer's conversations per core, within the p99 bar"].startswith("-")


def test_a_lost_chunk_fails_the_delivery_bar(capsys: pytest.CaptureFixture[str]) -> None:
    got = verdicts([row("local", 300, 90, 100), row("relay", 300, 50, 5, lost=1)], capsys)
    assert got["0 lost, duplicated or out of order, rejoins included"] == \
        "FAIL  0 lost, duplicated or out of order, rejoins included: 1 in 2 runs"
