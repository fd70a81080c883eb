"""One backend subscription recorded whole, for the hosting tests (local and Ray backends alike):
every wait is a condition over what arrived, bounded by a timeout — never a sleep."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from actors.identity import Owner
from protocol.events import Event

TIMEOUT = 90.0


class Watch:
    """`backend.subscribe(owner, cid, after)` in a task of its own; `events` holds every event it got."""

    def __init__(self, backend: Any, cid: str, after: int = 0, *, owner: Owner) -> None:
        self.events: list[Event] = []
        self.changed = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(backend, cid, after, owner))

    async def _run(self, backend: Any, cid: str, after: int, owner: Owner) -> None:
        async for batch in backend.subscribe(owner, cid, after):
            self.events.extend(batch)
            self.changed.set()

    async def until(self, predicate: Callable[[list[Event]], bool], timeout: float = TIMEOUT) -> None:
        async def wait() -> None:
            while not predicate(self.events):
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(wait(), timeout)

    async def until_event(self, name: str, count: int = 1, timeout: float = TIMEOUT) -> None:
        await self.until(lambda evs: sum(e.event == name for e in evs) >= count, timeout)

    def completed(self) -> list[Any]:
        """The `turn.completed` data, in order."""
        return [e.data for e in self.events if e.event == "turn.completed"]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def contiguous(events: list[Event], first: int = 1) -> bool:
    """Seqs `first`, `first + 1`, … with no gap and no duplicate."""
    return [e.seq for e in events] == list(range(first, first + len(events)))
