"""Export: a conversation's whole log, read from the store (docs/wire-protocol.md#export).

Consumer-side code, like subscriptions: both backends run it in the gateway process, after their
ownership check. The log is durable, append-only and gap-free, so an export is a plain read of seqs
1 to the head at the time of the request, page by page: every event exactly as a subscriber got it
(the store gives back what was published, field for field). Nothing live is merged in: the export
ends at its head, whatever the conversation does meanwhile.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from actors.hosting.backend import Export, Forbidden
from actors.hosting.subscription import PAGE
from actors.store import Store, Tombstoned
from protocol.events import Event


async def export_log(store: Store, conversation_id: str, request_id: str, now: float) -> Export:
    """The export of a conversation whose ownership was checked. `request_id` is remembered in the
    conversation's idempotency keys, like a command's id: a repeat is acked `duplicate`, and since
    an export changes nothing it is sent again, whole (a client retries one it lost to a dropped
    connection with the same id)."""
    try:
        new = await store.remember_key(conversation_id, request_id, now)
    except Tombstoned:
        raise Forbidden(conversation_id) from None  # deleted since the ownership check
    head = await store.last_seq(conversation_id)
    return Export("accepted" if new else "duplicate", head, _pages(store, conversation_id, head))


async def _pages(store: Store, conversation_id: str, head: int) -> AsyncIterator[list[Event]]:
    last = 0
    while last < head:
        page = await store.read_events(conversation_id, last, limit=min(PAGE, head - last))
        if not page:
            return  # deleted while it was exported: the log is gone
        last = page[-1].seq
        yield page
