"""Who is calling (docs/wire-protocol.md#authentication): a JWT with claims `sub`, `tenant`, `exp`, `iat`.

The token comes from `Authorization: Bearer <JWT>` or, for browsers that cannot set headers on
a WebSocket, `?token=<JWT>`. A refused token rejects the *handshake* with HTTP 401 (the server's
`process_request`): an unauthenticated client never gets a WebSocket, so it never gets an
`unauthorized` error frame either. An accepted token bounds the connection: the gateway closes
it at the token's `exp` with 4001 (`Caller.expires_at`, gateway/session.py).

Keys are decided at start-up (`load_verifier`), never by the token: HS256 with
`REACTGATE_AUTH_SECRET` (at least 32 bytes), or RS256/ES256 with a PEM public key
(`REACTGATE_JWT_PUBLIC_KEY_FILE`) or a JWKS file (`REACTGATE_JWKS_FILE`, keys picked by `kid`).
Each key verifies only its own algorithm, so a token cannot choose `none`, HS512, or HS256 signed
with a public key (algorithm confusion). `exp` and `iat` are required and `exp - iat` may not
exceed `max_token_ttl_s`: a leaked token is useful for a bounded time. `iss` and `aud` are
required and checked when configured; with no audience configured a token carrying one is refused
(it was minted for another service).

With no key configured every caller is the anonymous owner `local`/`local`; the server only
allows that on a loopback address (`gateway.settings.check_bind`).

Tokens and keys are secrets: nothing here logs them or puts them in an error message.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import SecretStr

from actors.identity import Caller, Owner
from gateway.settings import Settings

ANONYMOUS = Owner(tenant="local", sub="local")
MIN_SECRET_BYTES: Final = 32   # HS256 key strength: RFC 7518 §3.2 wants a key as long as the hash
MIN_RSA_BITS: Final = 2048
ASYMMETRIC_ALGORITHMS: Final = ("RS256", "ES256")


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


@dataclass(frozen=True, slots=True)
class Authenticated:
    """An authenticated handshake: who, until when (the token's `exp`, unix seconds; None for the
    anonymous caller, whose connection never expires), and the token's verified claims, of which
    tools see only those an operator names (`REACTGATE_TOOL_CLAIMS`, `tool_caller`)."""

    owner: Owner
    expires_at: float | None = None
    claims: Mapping[str, Any] = field(default_factory=dict)

    def tool_caller(self, names: Sequence[str]) -> Caller:
        """What a tool may know of who calls (docs/design.md#your-tools): tenant, sub and the named claims."""
        return Caller.of(self.owner, {name: self.claims[name] for name in names if name in self.claims})


ANONYMOUS_CALLER: Final = Authenticated(ANONYMOUS)


class AuthConfigError(ValueError):
    """The auth settings cannot work: `reactgate serve` stops with this message (it names settings
    and files, never a secret's value)."""


@dataclass(frozen=True, slots=True)
class _Key:
    key: Any          # the HS256 secret (bytes) or a `cryptography` public key
    algorithm: str    # the one algorithm this key verifies


class Verifier:
    """Verifies tokens with keys fixed at start-up (`load_verifier`)."""

    def __init__(
        self,
        keys: Mapping[str, _Key] | _Key,
        *,
        issuer: str | None = None,
        audience: str | None = None,
        max_ttl_s: float,
    ) -> None:
        # A single key verifies every token, whatever its `kid`; a JWKS is looked up by `kid`
        # (a token without one is accepted only when the set holds a single key).
        self._by_kid: Mapping[str, _Key] = {} if isinstance(keys, _Key) else dict(keys)
        only = list(self._by_kid.values()) if not isinstance(keys, _Key) else [keys]
        self._single = only[0] if len(only) == 1 else None
        self.issuer = issuer
        self.audience = audience
        self.max_ttl_s = max_ttl_s
        self._required = ["exp", "iat", "sub", "tenant"]
        if issuer is not None:
            self._required.append("iss")
        if audience is not None:
            self._required.append("aud")

    def verify(self, token: str) -> Authenticated:
        key = self._key_for(token)
        try:
            claims = jwt.decode(
                token, key.key, algorithms=[key.algorithm], issuer=self.issuer, audience=self.audience,
                options={"require": self._required},
            )
        except jwt.ExpiredSignatureError:
            raise Unauthorized("token expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthorized("token not yet valid") from None
        except jwt.MissingRequiredClaimError as exc:
            raise Unauthorized(f"token lacks the required claim {exc.claim!r}") from None
        except jwt.InvalidIssuerError:
            raise Unauthorized("token issuer not accepted") from None
        except jwt.InvalidAudienceError:
            raise Unauthorized("token audience not accepted") from None
        except jwt.InvalidAlgorithmError:
            raise Unauthorized("invalid token: algorithm not accepted") from None
        except jwt.InvalidTokenError:
            raise Unauthorized("invalid token") from None
        lifetime = float(claims["exp"]) - float(claims["iat"])
        if lifetime > self.max_ttl_s:
            raise Unauthorized(f"token lifetime exceeds the maximum of {self.max_ttl_s:g} s (exp - iat)")
        sub, tenant = claims.get("sub"), claims.get("tenant")
        if not isinstance(sub, str) or not sub or not isinstance(tenant, str) or not tenant:
            raise Unauthorized("claims `sub` and `tenant` must be non-empty strings")
        return Authenticated(Owner(tenant=tenant, sub=sub), expires_at=float(claims["exp"]), claims=claims)

    def _key_for(self, token: str) -> _Key:
        if not self._by_kid:
            assert self._single is not None
            return self._single
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError:
            raise Unauthorized("invalid token") from None
        if kid is None and self._single is not None:
            return self._single
        key = self._by_kid.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise Unauthorized("invalid token: unknown signing key (kid)")
        return key


def authenticate(
    headers: _Headers | Mapping[str, str],
    query: str | Mapping[str, str],
    verifier: Verifier | None,
) -> Authenticated:
    """The caller. Raises Unauthorized (→ HTTP 401) when auth is configured and the token fails."""
    if verifier is None:
        return ANONYMOUS_CALLER
    token = token_from(headers, query)
    if token is None:
        raise Unauthorized("missing token: send `Authorization: Bearer <JWT>` or `?token=<JWT>`")
    return verifier.verify(token)


# -- start-up: the keys -----------------------------------------------------------------------------


def load_verifier(settings: Settings) -> Verifier | None:
    """The verifier the settings describe; None when no key is configured (anonymous loopback mode).
    Raises AuthConfigError for anything that cannot work, so `reactgate serve` stops before serving."""
    sources = {
        "REACTGATE_AUTH_SECRET": settings.auth_secret,
        "REACTGATE_JWT_PUBLIC_KEY_FILE": settings.jwt_public_key_file,
        "REACTGATE_JWKS_FILE": settings.jwks_file,
    }
    configured = [name for name, value in sources.items() if value is not None]
    if not configured:
        for name, value in (("REACTGATE_JWT_ISSUER", settings.jwt_issuer),
                            ("REACTGATE_JWT_AUDIENCE", settings.jwt_audience)):
            if value is not None:
                raise AuthConfigError(f"{name} is set but no token key is: set REACTGATE_AUTH_SECRET, "
                                      "REACTGATE_JWT_PUBLIC_KEY_FILE or REACTGATE_JWKS_FILE")
        return None
    if len(configured) > 1:
        raise AuthConfigError(f"set only one of {' and '.join(configured)}: tokens are verified with one key source")
    keys: Mapping[str, _Key] | _Key
    if settings.auth_secret is not None:
        keys = _secret_key(settings.auth_secret)
    elif settings.jwt_public_key_file is not None:
        keys = _pem_key(settings.jwt_public_key_file)
    else:
        assert settings.jwks_file is not None
        keys = _jwks_keys(settings.jwks_file)
    return Verifier(keys, issuer=settings.jwt_issuer, audience=settings.jwt_audience,
                    max_ttl_s=settings.max_token_ttl_s)


def _secret_key(secret: SecretStr) -> _Key:
    raw = secret.get_secret_value().encode()
    if len(raw) < MIN_SECRET_BYTES:
        raise AuthConfigError(
            f"REACTGATE_AUTH_SECRET is {len(raw)} bytes; an HS256 secret needs at least {MIN_SECRET_BYTES} "
            "(e.g. `openssl rand -hex 32`)"
        )
    return _Key(raw, "HS256")


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AuthConfigError(f"cannot read {setting} {str(path)!r}: {exc.strerror or exc}") from None


def _pem_key(path: Path) -> _Key:
    setting = "REACTGATE_JWT_PUBLIC_KEY_FILE"
    data = _read(path, setting)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise AuthConfigError(f"{setting} {str(path)!r} is not a PEM public key") from None
    try:
        return _Key(key, _algorithm_of(key))
    except AuthConfigError as exc:
        raise AuthConfigError(f"{setting} {str(path)!r}: {exc}") from None


def _algorithm_of(key: object) -> str:
    """The one algorithm a public key verifies: RS256 for RSA (≥ 2048 bits), ES256 for P-256."""
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise AuthConfigError(f"an RSA key of {key.key_size} bits; at least {MIN_RSA_BITS} are required")
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return "ES256"
    raise AuthConfigError(f"a {type(key).__name__.lstrip('_')}; only RSA (RS256) and P-256 (ES256) keys are accepted")


def _jwks_keys(path: Path) -> dict[str, _Key] | _Key:
    """The signing keys of a JWKS file. Keys for encryption (`use: enc`) or for algorithms other
    than RS256/ES256 are skipped; at least one must remain."""
    setting = "REACTGATE_JWKS_FILE"
    where = f"{setting} {str(path)!r}"
    data = _read(path, setting)
    try:
        document = json.loads(data)
    except ValueError:
        raise AuthConfigError(f"{where} is not JSON") from None
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise AuthConfigError(f"{where} is not a JWKS: expected an object with a `keys` list")
    keys: list[tuple[str | None, _Key]] = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        kid = entry.get("kid")
        name = f"key {kid!r}" if isinstance(kid, str) else f"key #{n}"
        try:
            jwk = jwt.PyJWK(entry)
        except jwt.PyJWTError:  # its message may quote the key: never repeated
            raise AuthConfigError(f"{where}: {name} is not a usable JWK") from None
        if jwk.algorithm_name not in ASYMMETRIC_ALGORITHMS:
            continue  # e.g. an `oct` (shared secret) or RS512 key: not one this gateway accepts
        try:
            algorithm = _algorithm_of(jwk.key)
        except AuthConfigError as exc:
            raise AuthConfigError(f"{where}: {name} is {exc}") from None
        if algorithm != jwk.algorithm_name:
            raise AuthConfigError(f"{where}: {name} says alg {jwk.algorithm_name} but holds a key for {algorithm}")
        keys.append((kid if isinstance(kid, str) else None, _Key(jwk.key, algorithm)))
    if not keys:
        raise AuthConfigError(f"{where} holds no RS256 or ES256 signing key")
    if len(keys) == 1 and keys[0][0] is None:
        return keys[0][1]
    if any(kid is None for kid, _ in keys):
        raise AuthConfigError(f"{where}: with several keys, every key needs a `kid`")
    by_kid = {kid: key for kid, key in keys if kid is not None}
    if len(by_kid) != len(keys):
        raise AuthConfigError(f"{where}: two keys share a `kid`")
    return by_kid
