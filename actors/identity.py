"""Who a caller is, as every floor that checks or records it sees it.

The store records each conversation's owner and the hosting layer checks it before any call
(docs/design.md#hosting), so the identity lives below both: `actors/store/` imports nothing from
`actors/hosting/` (tests/test_layout.py, the floors).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may open, watch and write to a conversation: `sub` + `tenant` of the JWT."""

    tenant: str
    sub: str
