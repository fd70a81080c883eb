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
        """Wait for `predicate`; a subscription that ends or raises first fails the wait at once, with
        its error and the events it got, rather than as a timeout that says nothing."""
        async def wait() -> None:
            while not predicate(self.events):
                if self.task.done():
                    ended = "ended" if self.task.cancelled() or self.task.exception() is None else "raised"
                    raise AssertionError(f"the subscription {ended} before the condition held; it got "
                                         f"{[(e.seq, e.event) for e in self.events]}") from (
                        None if self.task.cancelled() else self.task.exception())
                self.changed.clear()
                changed = asyncio.ensure_future(self.changed.wait())
                try:
                    await asyncio.wait([changed, self.task], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    changed.cancel()
        try:
            await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"not within {timeout} s; the subscription got "
                                 f"{[(e.seq, e.event) for e in self.events]}") from None

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
