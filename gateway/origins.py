"""Which web pages may open a WebSocket to this gateway: the `Origin` check (README.md#security).

A browser lets any page open a WebSocket to any address and says which page did in `Origin`; only
the server can refuse a page it does not know. Without it a foreign page could drive the
anonymous loopback gateway from the user's browser (cross-site WebSocket hijacking), including
through a host name that its owner makes resolve to 127.0.0.1 (DNS rebinding). Programs that
are not browsers send no `Origin` and cannot be driven by a page: they are always accepted.

- no auth configured: loopback origins only — http(s)://127.0.0.0/8, localhost or [::1], any
  port (the console served on loopback is one of them);
- auth configured: the origins in `allowed_origins`, and the gateway's own origin — the page the
  console was served from, whose `Origin` names the request's `Host`. (A rebound host name
  passes that test too, but with auth on, a page still needs a token, which no browser attaches
  by itself: tokens travel in a header or the URL, never in a cookie.)

Origins are compared as (scheme, host, port) with the scheme's default port filled in, so
`https://app.example` and `https://app.example:443` are one origin. A refusal is HTTP 403 at the
handshake (`gateway/server.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from gateway.settings import Settings, is_loopback

DEFAULT_PORTS: Final = {"http": 80, "https": 443}

Origin = tuple[str, str, int]  # scheme, lower-case host (IPv6 without brackets), port


class OriginConfigError(ValueError):
    """`allowed_origins` cannot work; `reactgate serve` stops with this message."""


def parse_origin(value: str) -> Origin | None:
    """`scheme://host[:port]` as an Origin; None for anything else (`null`, a path, another scheme)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if (parts.scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username is not None):
        return None
    return parts.scheme, parts.hostname, DEFAULT_PORTS[parts.scheme] if port is None else port


def _host_header(value: str, scheme: str) -> tuple[str, int] | None:
    """A `Host` header (`host[:port]`) as (host, port), the port defaulting to the scheme's."""
    try:
        parts = urlsplit(f"//{value.strip()}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.username is not None:
        return None
    return parts.hostname, DEFAULT_PORTS[scheme] if port is None else port


@dataclass(frozen=True)
class OriginPolicy:
    auth: bool                        # auth configured: allowed + same origin; else loopback only
    allowed: frozenset[Origin] = frozenset()

    @classmethod
    def from_settings(cls, settings: Settings) -> OriginPolicy:
        allowed = set()
        for value in settings.allowed_origins:
            origin = parse_origin(value)
            if origin is None:
                raise OriginConfigError(
                    f"REACTGATE_ALLOWED_ORIGINS: {value!r} is not an origin (scheme://host[:port], http or https)"
                )
            allowed.add(origin)
        if allowed and not settings.auth_configured:
            raise OriginConfigError(
                "REACTGATE_ALLOWED_ORIGINS needs auth configured: without a token key only loopback "
                "origins may connect"
            )
        return cls(auth=settings.auth_configured, allowed=frozenset(allowed))

    def allows(self, origins: list[str], host: str | None) -> bool:
        """Whether a handshake carrying these `Origin` headers (usually none or one) and this `Host`
        may go on."""
        if not origins:
            return True  # not a browser
        if len(origins) > 1:
            return False
        origin = parse_origin(origins[0])
        if origin is None:
            return False
        scheme, hostname, port = origin
        if not self.auth:
            return is_loopback(hostname)
        if origin in self.allowed:
            return True
        return host is not None and _host_header(host, scheme) == (hostname, port)
