"""Who a caller is, as every floor that checks or records it sees it.

The store records each conversation's owner and the hosting layer checks it before any call
(docs/design.md#hosting), so the identity lives below both: `actors/store/` imports nothing from
`actors/hosting/` (tests/test_layout.py, the floors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgspec


@dataclass(frozen=True, slots=True)
class Owner:
    """Who may open, watch and write to a conversation: `sub` + `tenant` of the JWT."""

    tenant: str
    sub: str


class Caller(msgspec.Struct, frozen=True, omit_defaults=True):
    """Who a tool call serves (docs/design.md#your-tools): the tenant and sub of the token that sent
    the message of its turn, and the claims of that token an operator chose to pass on
    (`REACTGATE_TOOL_CLAIMS`). Never the token itself. It travels with the message and stays in
    the turn's checkpoint, so a call resumed after a crash serves the same caller."""

    tenant: str
    sub: str
    claims: dict[str, Any] = msgspec.field(default_factory=dict)

    @classmethod
    def of(cls, owner: Owner, claims: dict[str, Any] | None = None) -> Caller:
        return cls(owner.tenant, owner.sub, dict(claims or {}))

    def as_meta(self) -> dict[str, Any]:
        """The caller as an MCP request's `_meta` carries it, under `CALLER_META`."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


# Where an MCP tool call carries its caller, in the request's `_meta` (docs/design.md#mcp-servers).
CALLER_META: Final = "reactgate/caller"
