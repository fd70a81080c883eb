"""Who is calling (docs/wire-protocol.md#authentication): a JWT HS256 with claims `sub` and `tenant`.

The token comes from `Authorization: Bearer <JWT>` or, for browsers that cannot set headers on
a WebSocket, `?token=<JWT>`. A refused token rejects the *handshake* with HTTP 401 (the server's
`process_request`): an unauthenticated client never gets a WebSocket, so it never gets an
`unauthorized` error frame either.

With no secret configured every caller is the anonymous owner `local`/`local`; the server only
allows that on a loopback address (`gateway.settings.check_bind`).

Tokens are secrets: nothing here logs them or puts them in an error message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol
from urllib.parse import parse_qs

import jwt
from pydantic import SecretStr

from actors.hosting.backend import Owner

ANONYMOUS = Owner(tenant="local", sub="local")
ALGORITHMS = ["HS256"]


class Unauthorized(Exception):
    """The handshake is refused with HTTP 401. The message is safe to send: it never holds the token."""


class _Headers(Protocol):
    def get(self, key: str, default: str | None = None) -> str | None: ...


def token_from(headers: _Headers | Mapping[str, str], query: str | Mapping[str, str]) -> str | None:
    """The bearer token from the Authorization header, else from the `token` query parameter."""
    auth = headers.get("Authorization") or headers.get("authorization")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    if isinstance(query, str):
        values = parse_qs(query.lstrip("?")).get("token")
        return values[-1] if values else None
    return query.get("token") or None


def verify(token: str, secret: SecretStr | str) -> Owner:
    """Verify an HS256 token; `exp` is honoured when present, `sub` and `tenant` are required."""
    key = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    try:
        claims = jwt.decode(token, key, algorithms=ALGORITHMS, options={"require": ["sub", "tenant"]})
    except jwt.ExpiredSignatureError:
        raise Unauthorized("token expired") from None
    except jwt.MissingRequiredClaimError as exc:
        raise Unauthorized(f"token lacks the required claim {exc.claim!r}") from None
    except jwt.InvalidTokenError:
        raise Unauthorized("invalid token") from None
    sub, tenant = claims.get("sub"), claims.get("tenant")
    if not isinstance(sub, str) or not sub or not isinstance(tenant, str) or not tenant:
        raise Unauthorized("claims `sub` and `tenant` must be non-empty strings")
    return Owner(tenant=tenant, sub=sub)


def authenticate(
    headers: _Headers | Mapping[str, str],
    query: str | Mapping[str, str],
    secret: SecretStr | str | None,
) -> Owner:
    """The caller's Owner. Raises Unauthorized (→ HTTP 401) when a secret is set and the token fails."""
    if secret is None:
        return ANONYMOUS
    token = token_from(headers, query)
    if token is None:
        raise Unauthorized("missing token: send `Authorization: Bearer <JWT>` or `?token=<JWT>`")
    return verify(token, secret)
