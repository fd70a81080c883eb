"""Durable stores behind conversations (docs/design.md#store): embedded SQLite, PostgreSQL for clusters.

`store_from_url` builds an unopened store from `--store`; `open_store` builds and opens it:

- `sqlite:///relative/path.db`, `sqlite:////absolute/path.db`, `sqlite://:memory:`; optionally
  `?synchronous=NORMAL` (fsync per checkpoint only: survives a process crash, not an OS crash;
  the default FULL fsyncs every group commit — see actors/store/sqlite.py)
- `postgresql://user@host:port/db` (or `postgres://`), optionally `?schema=NAME` to keep every
  table in that schema.

Both share one schema and one set of SQL statements, rendered per dialect: actors/store/schema.py.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from actors.store.base import (
    IDEMPOTENCY_TTL_S,
    ConversationExists,
    RoundOutput,
    SeqConflict,
    Store,
    StoreClosed,
    StoreError,
    StoreHealth,
    StoreStats,
    StoreUnavailable,
    Tombstoned,
)

__all__ = [
    "IDEMPOTENCY_TTL_S",
    "ConversationExists",
    "RoundOutput",
    "SeqConflict",
    "Store",
    "StoreClosed",
    "StoreError",
    "StoreHealth",
    "StoreStats",
    "StoreUnavailable",
    "Tombstoned",
    "open_store",
    "store_from_url",
]


def store_from_url(url: str) -> Store:
    """The store a URL names, not yet opened. Raises ValueError for an unknown scheme."""
    scheme, _, rest = url.partition("://")
    if scheme == "sqlite":
        from actors.store.sqlite import MEMORY, SqliteStore

        path, _, query = rest.partition("?")
        options = dict(parse_qsl(query))
        synchronous = options.pop("synchronous", "FULL").upper()
        if options or synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"sqlite store URL takes only ?synchronous=FULL|NORMAL, got {url!r}")
        if path in (MEMORY, "/" + MEMORY):
            return SqliteStore(MEMORY)
        if not path.startswith("/") or path == "/":
            raise ValueError(f"sqlite store URL needs a path, e.g. sqlite:///reactgate.db, got {url!r}")
        return SqliteStore(path[1:], synchronous="FULL" if synchronous == "FULL" else "NORMAL")
    if scheme in ("postgresql", "postgres"):
        from actors.store.postgres import PostgresStore

        parts = urlsplit(url)
        params = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((value for key, value in params if key == "schema"), None)
        rest_query = urlencode([(key, value) for key, value in params if key != "schema"])
        return PostgresStore(urlunsplit(parts._replace(query=rest_query)), schema=schema or None)
    raise ValueError(f"unknown store URL {url!r}: expected sqlite:///PATH or postgresql://...")


async def open_store(url: str) -> Store:
    """The store a URL names, opened (schema created if needed)."""
    store = store_from_url(url)
    await store.open()
    return store
