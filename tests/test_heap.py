"""The collector settings of a serving process (actors/heap.py): the gateway takes them once it has
started, so that young collections do not walk every event's objects (bench/profiles/peer-bench-local-100-perf.txt)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors import heap
from tests.e2e import local_server


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("restored_gc")
async def test_a_started_gateway_freezes_what_it_loaded_and_collects_young_objects_rarely(tmp_path: Path) -> None:
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
    async with local_server(tmp_path / "store.sqlite3"):
        assert gc.get_threshold() == heap.THRESHOLDS
        assert gc.get_freeze_count() > 0
    assert heap.THRESHOLDS[0] >= 10_000   # a young collection per ~100 events at most, not every other one
