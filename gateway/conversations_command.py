"""`reactgate conversations`: the conversation list, for operators (docs/design.md#conversation-list).

The same list a caller gets from `list` or GET /v1/conversations, read straight from the store:
one owner's (`--tenant` and `--sub`), or everyone's, most recently active first, a page at a time
(`--before` the cursor the previous page printed). Each row names its owner, so that an id can go
on to `reactgate replay --conversation`. Exit 0; 2 on bad input (the message names the problem).
The store is only read, except that opening it creates any missing table, as `serve` would.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any, Final

import msgspec
from rich.console import Console
from rich.table import Table

from actors.identity import Owner
from actors.store.base import ListedConversation
from gateway.replay_command import BadInput, open_for_reading, redacted
from protocol.frames import InvalidCursor, decode_cursor, encode_cursor

EXIT_OK: Final = 0
EXIT_USAGE: Final = 2
LIMIT_MAX: Final = 1000


def run(args: argparse.Namespace) -> int:
    """`reactgate conversations` (its arguments: gateway/cli.py)."""
    err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)
    try:
        owner = _owner(args.tenant, args.sub)
        if not 1 <= args.limit <= LIMIT_MAX:
            raise BadInput(f"--limit must be from 1 to {LIMIT_MAX}")
        before = decode_cursor(args.before) if args.before else None
        rows = asyncio.run(_read(args.store, owner, args.limit + 1, before))
    except (BadInput, InvalidCursor) as exc:
        err.print(f"reactgate conversations: {exc}", markup=False)
        return EXIT_USAGE
    page, more = rows[: args.limit], len(rows) > args.limit
    next_before = encode_cursor(page[-1].entry) if more else None
    if args.json:
        document: dict[str, Any] = {"conversations": [_document(row) for row in page]}
        if next_before is not None:
            document["next_before"] = next_before
        sys.stdout.write(msgspec.json.encode(document).decode() + "\n")
    else:
        _print(page)
        if next_before is not None:
            err.print(f"more: --before {next_before}", markup=False)
    return EXIT_OK


def _owner(tenant: str | None, sub: str | None) -> Owner | None:
    if (tenant is None) != (sub is None):
        raise BadInput("--tenant and --sub go together: one owner's conversations, or (neither) everyone's")
    return Owner(tenant=tenant, sub=sub) if tenant is not None and sub is not None else None


async def _read(url: str, owner: Owner | None, limit: int, before: tuple[float, str] | None) -> list[ListedConversation]:
    store = open_for_reading(url)
    try:
        await store.open()
    except Exception as exc:  # an unreachable server, a file that is no database: bad input here
        raise BadInput(f"cannot open the store {redacted(url)}: {exc}") from None
    try:
        return await store.list_conversations(owner, limit, before)
    finally:
        await store.close()


def _document(row: ListedConversation) -> dict[str, Any]:
    entry: dict[str, Any] = msgspec.to_builtins(row.entry)
    return {"tenant": row.owner.tenant, "sub": row.owner.sub, **entry}


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _print(rows: list[ListedConversation]) -> None:
    # Titles are users' words: no markup, no emoji codes, nothing rich would reinterpret.
    out = Console(highlight=False, soft_wrap=True, emoji=False, width=None if sys.stdout.isatty() else 200)
    table = Table()
    for column in ("conversation", "tenant", "sub", "agent", "last active (UTC)", "last seq", "running", "title"):
        table.add_column(column)
    for row in rows:
        e = row.entry
        table.add_row(e.conversation_id, row.owner.tenant, row.owner.sub, e.agent, _when(e.last_active_at),
                      str(e.last_seq), "yes" if e.running else "", e.title)
    out.print(table, markup=False)
