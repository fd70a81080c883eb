"""Durable stores behind conversations (docs/design.md#store): embedded SQLite, PostgreSQL for clusters.

`store_from_url` builds an unopened store from `--store`; `open_store` builds and opens it:

- `sqlite:///relative/path.db`, `sqlite:////absolute/path.db`, `sqlite://:memory:`; optionally
  `?synchronous=NORMAL` (fsync per checkpoint only: survives a process crash, not an OS crash;
  the default FULL fsyncs every group commit — see actors/store/sqlite.py)
- `postgresql://user@host:port/db` (or `postgres://`), optionally `?schema=NAME` to keep every
  table in that schema.
- either, optionally `append_interval_ms=MS`: how long after a commit began appends alone may wait
  for the next (`APPEND_INTERVAL_S`, 10 ms; 0: commit them at once).

Both share one schema and one set of SQL statements, rendered per dialect: actors/store/schema.py.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from actors.store.base import (
    APPEND_INTERVAL_S,
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
        interval = _append_interval(options.pop(APPEND_INTERVAL, None), url)
        synchronous = options.pop("synchronous", "FULL").upper()
        if options or synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"sqlite store URL takes only ?synchronous=FULL|NORMAL and {APPEND_INTERVAL}=MS, got {url!r}")
        if path in (MEMORY, "/" + MEMORY):
            return SqliteStore(MEMORY, append_interval_s=interval)
        if not path.startswith("/") or path == "/":
            raise ValueError(f"sqlite store URL needs a path, e.g. sqlite:///reactgate.db, got {url!r}")
        return SqliteStore(path[1:], synchronous="FULL" if synchronous == "FULL" else "NORMAL", append_interval_s=interval)
    if scheme in ("postgresql", "postgres"):
        from actors.store.postgres import PostgresStore

        parts = urlsplit(url)
        params = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((value for key, value in params if key == "schema"), None)
        interval = _append_interval(next((value for key, value in params if key == APPEND_INTERVAL), None), url)
        rest_query = urlencode([(key, value) for key, value in params if key not in ("schema", APPEND_INTERVAL)])
        return PostgresStore(urlunsplit(parts._replace(query=rest_query)), schema=schema or None,
                             append_interval_s=interval)
    raise ValueError(f"unknown store URL {url!r}: expected sqlite:///PATH or postgresql://...")


APPEND_INTERVAL = "append_interval_ms"


def _append_interval(value: str | None, url: str) -> float:
    if value is None:
        return APPEND_INTERVAL_S
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= 1000:
        raise ValueError(f"{APPEND_INTERVAL} must be a number of milliseconds from 0 to 1000, got {value!r} in {url!r}")
    return ms / 1000


async def open_store(url: str) -> Store:
    """The store a URL names, opened (schema created if needed)."""
    store = store_from_url(url)
    await store.open()
    return store
