"""What a gateway lists without asking a host: the agents it serves and a caller's conversations
(docs/design.md#several-agents, docs/design.md#conversation-list).

Both backends answer from here: the agents from their profiles, the conversations from the store
every host writes them to — one indexed keyset query per page, filtered by the caller, so a page
never holds another owner's conversation whatever cursor it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

from actors.identity import Owner
from actors.profile import AgentProfile
from actors.store import Store
from protocol.frames import AgentEntry, AgentList, ConversationPage, decode_cursor, encode_cursor


def agent_list(profiles: Mapping[str, AgentProfile], default: str) -> AgentList:
    """The default first, then the others in their order."""
    ordered = sorted(profiles.values(), key=lambda p: p.name != default)
    return AgentList(default=default, agents=[AgentEntry(name=p.name, description=p.summary) for p in ordered])


async def conversation_page(store: Store, owner: Owner | None, limit: int, before: str | None) -> ConversationPage:
    """Up to `limit` conversations of `owner` (None: of everyone, for operators) after `before`, and
    the cursor of the next page when there may be one. Raises InvalidCursor."""
    position = decode_cursor(before) if before is not None else None
    rows = await store.list_conversations(owner, limit + 1, position)  # one more: is there a next page?
    entries = [row.entry for row in rows[:limit]]
    more = len(rows) > limit
    return ConversationPage(conversations=entries, next_before=encode_cursor(entries[-1]) if more else None)
