"""gateway/auth.py, gateway/origins.py and gateway/settings.py: who is calling, from which page, and
where the server may listen."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import SecretStr

from actors.identity import Owner
from gateway.auth import (
    ANONYMOUS,
    AuthConfigError,
    Unauthorized,
    Verifier,
    authenticate,
    load_verifier,
    token_from,
)
from gateway.origins import OriginConfigError, OriginPolicy
from gateway.settings import BindRefused, Settings, check_bind, is_loopback

SECRET = "unit-test-secret-" * 4  # 68 bytes: long enough for HS512 too


def verifier(**settings: object) -> Verifier:
    found = load_verifier(Settings(auth_secret=SecretStr(SECRET), **settings))  # type: ignore[arg-type]
    assert found is not None
    return found


VERIFIER = verifier()


def make(exp_in: float | None = 3600, *, key: str = SECRET, algorithm: str = "HS256", **claims: object) -> str:
    """A valid token by default (`iat` now, `exp` in `exp_in` s); a claim given as None is left out."""
    now = int(time.time())
    payload: dict[str, object] = {"sub": "alice", "tenant": "acme", "iat": now, **claims}
    if exp_in is not None:
        payload["exp"] = now + int(exp_in)
    return jwt.encode({k: v for k, v in payload.items() if v is not None}, key, algorithm=algorithm)


def test_bearer_header_gives_the_owner() -> None:
    caller = authenticate({"Authorization": f"Bearer {make()}"}, "", VERIFIER)
    assert caller.owner == Owner(tenant="acme", sub="alice")


def test_the_caller_expires_at_the_tokens_exp() -> None:
    token = make(exp_in=600)
    assert authenticate({}, {"token": token}, VERIFIER).expires_at == jwt.decode(
        token, options={"verify_signature": False})["exp"]


def test_query_token_gives_the_owner() -> None:
    assert authenticate({}, f"a=1&token={make()}", VERIFIER).owner == Owner(tenant="acme", sub="alice")
    assert authenticate({}, {"token": make()}, VERIFIER).owner == Owner(tenant="acme", sub="alice")


def test_the_header_wins_over_the_query() -> None:
    assert token_from({"Authorization": "bearer H"}, "token=Q") == "H"
    assert token_from({"Authorization": "Basic xyz"}, "token=Q") == "Q"
    assert token_from({}, "") is None


def test_no_secret_means_anonymous_local() -> None:
    caller = authenticate({}, "", None)
    assert caller.owner == ANONYMOUS == Owner(tenant="local", sub="local")
    assert caller.expires_at is None  # an anonymous connection never expires


def test_a_token_without_exp_is_refused() -> None:
    with pytest.raises(Unauthorized, match="token lacks the required claim 'exp'"):
        authenticate({}, {"token": make(exp_in=None)}, VERIFIER)


@pytest.mark.parametrize(
    ("mint", "why"),
    [
        (lambda: None, "missing token"),
        (lambda: "garbage", "invalid token"),
        (lambda: make(exp_in=-1), "token expired"),
        (lambda: make(exp_in=None), "'exp'"),
        (lambda: make(iat=None), "'iat'"),
        (lambda: make(iat=int(time.time()) + 600, exp_in=1200), "token not yet valid"),
        (lambda: make(exp_in=86_400 + 120), "token lifetime exceeds the maximum of 86400 s"),
        (lambda: make(key="x" * 40), "invalid token"),
        (lambda: make(algorithm="HS512"), "invalid token: algorithm not accepted"),
        (lambda: make(key="", algorithm="none"), "invalid token: algorithm not accepted"),
        (lambda: make(aud="another-service"), "token audience not accepted"),
        (lambda: make(tenant=None), "'tenant'"),
        (lambda: make(sub=None), "'sub'"),
        (lambda: make(tenant=""), "non-empty"),
        (lambda: make(tenant=5), "non-empty"),
    ],
)
def test_refused_tokens_are_unauthorized_and_never_echoed(
    mint: Callable[[], str | None], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    token = mint()  # minted as the test runs: a token made at collection ages while the suite runs
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Unauthorized, match=why) as info:
        authenticate({}, {"token": token} if token else {}, VERIFIER)
    if token:
        assert token not in str(info.value)
        assert token not in caplog.text


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    check_bind(Settings(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.1", "example.com", "192.168.1.2"])
def test_non_loopback_without_secret_refuses(host: str) -> None:
    with pytest.raises(BindRefused, match="REACTGATE_AUTH_SECRET"):
        check_bind(Settings(host=host))
    check_bind(Settings(host=host, auth_secret=SecretStr(SECRET)))
    # a public key or a JWKS configures auth just as well (they are checked by load_verifier)
    check_bind(Settings(host=host, jwt_public_key_file=Path("key.pem")))
    check_bind(Settings(host=host, jwks_file=Path("jwks.json")))


def test_settings_read_the_environment_and_hide_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACTGATE_PORT", "9999")
    monkeypatch.setenv("REACTGATE_AUTH_SECRET", SECRET)
    monkeypatch.setenv("REACTGATE_BACKEND", "local")
    settings = Settings()
    assert settings.port == 9999 and settings.backend == "local"
    assert settings.auth_secret is not None and settings.auth_secret.get_secret_value() == SECRET
    assert SECRET not in repr(settings) and SECRET not in str(settings.model_dump())


def test_settings_defaults() -> None:
    s = Settings(_env_prefix="REACTGATE_UNUSED_")  # type: ignore[call-arg]
    assert (s.host, s.port, s.backend) == ("127.0.0.1", 8765, "ray")
    assert s.store == "sqlite:///./data/reactgate.sqlite3"
    assert (s.max_frame_bytes, s.send_queue_frames, s.rate_per_s, s.rate_burst) == (256 * 1024, 2000, 20, 50)
    assert (s.max_connections, s.max_conversations_per_connection, s.bad_frames_before_close) == (10_000, 64, 10)
    assert (s.drain_grace_s, s.idle_ttl_s, s.auth_secret) == (25, 600, None)


def test_security_settings_defaults() -> None:
    s = Settings(_env_prefix="REACTGATE_UNUSED_")  # type: ignore[call-arg]
    assert (s.jwt_public_key_file, s.jwks_file, s.jwt_issuer, s.jwt_audience) == (None, None, None, None)
    assert (s.max_token_ttl_s, s.allowed_origins, s.auth_configured) == (86_400, (), False)


# -- token policy ------------------------------------------------------------------------------------


def test_issuer_and_audience_are_required_and_checked_when_configured() -> None:
    strict = verifier(jwt_issuer="https://idp.example", jwt_audience="reactgate")
    assert strict.verify(make(iss="https://idp.example", aud="reactgate")).owner.sub == "alice"
    for token, why in [
        (make(aud="reactgate"), "'iss'"),
        (make(iss="https://idp.example"), "'aud'"),
        (make(iss="https://evil.example", aud="reactgate"), "token issuer not accepted"),
        (make(iss="https://idp.example", aud="another-service"), "token audience not accepted"),
    ]:
        with pytest.raises(Unauthorized, match=why):
            strict.verify(token)


def test_the_token_lifetime_cap_is_a_setting() -> None:
    short = verifier(max_token_ttl_s=300)
    assert short.verify(make(exp_in=300)).owner.sub == "alice"
    with pytest.raises(Unauthorized, match="token lifetime exceeds the maximum of 300 s"):
        short.verify(make(exp_in=301))


def test_an_hs256_secret_shorter_than_32_bytes_refuses_to_start() -> None:
    short = "s" * 31
    with pytest.raises(AuthConfigError, match="REACTGATE_AUTH_SECRET is 31 bytes; an HS256 secret needs at least 32") as info:
        load_verifier(Settings(auth_secret=SecretStr(short)))
    assert short not in str(info.value)
    assert load_verifier(Settings(auth_secret=SecretStr("s" * 32))) is not None


def test_issuer_audience_or_several_key_sources_without_one_key_refuse_to_start(tmp_path: Path) -> None:
    with pytest.raises(AuthConfigError, match="REACTGATE_JWT_ISSUER is set but no token key is"):
        load_verifier(Settings(jwt_issuer="https://idp.example"))
    with pytest.raises(AuthConfigError, match="set only one of REACTGATE_AUTH_SECRET and REACTGATE_JWKS_FILE"):
        load_verifier(Settings(auth_secret=SecretStr(SECRET), jwks_file=tmp_path / "jwks.json"))
    assert load_verifier(Settings()) is None  # anonymous loopback mode


# -- asymmetric keys --------------------------------------------------------------------------------------

Key = Any  # a cryptography private key


@pytest.fixture(scope="module")
def rsa_key() -> Key:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def pem(key: Key) -> bytes:
    return bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def jwk(key: Key, kid: str | None, **fields: Any) -> dict[str, Any]:
    algorithm = jwt.algorithms.RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else jwt.algorithms.ECAlgorithm
    entry: dict[str, Any] = json.loads(algorithm.to_jwk(key.public_key()))
    if kid is not None:
        entry["kid"] = kid
    return {**entry, **fields}


def signed(key: Key, algorithm: str, kid: str | None = None, **claims: Any) -> str:
    now = int(time.time())
    payload = {"sub": "alice", "tenant": "acme", "iat": now, "exp": now + 60, **claims}
    return jwt.encode(payload, key, algorithm=algorithm, headers={"kid": kid} if kid else None)


def hs256_keyed_with(key: bytes) -> str:
    """An HS256 token whose HMAC key is the server's *public* key (PyJWT refuses to mint one)."""
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    now = int(time.time())
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = b64(json.dumps({"sub": "alice", "tenant": "acme", "iat": now, "exp": now + 60}).encode())
    mac = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64(mac)}"


def test_rs256_with_a_pem_public_key(tmp_path: Path, rsa_key: Key) -> None:
    (tmp_path / "key.pem").write_bytes(pem(rsa_key))
    keyed = load_verifier(Settings(jwt_public_key_file=tmp_path / "key.pem"))
    assert keyed is not None
    assert keyed.verify(signed(rsa_key, "RS256")).owner == Owner(tenant="acme", sub="alice")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused: list[tuple[str, str]] = [
        (signed(other, "RS256"), "invalid token"),                       # the wrong key
        (signed(rsa_key, "RS512"), "algorithm not accepted"),            # not the configured algorithm
        (hs256_keyed_with(pem(rsa_key)), "algorithm not accepted"),       # algorithm confusion
        (make(key="", algorithm="none"), "algorithm not accepted"),
    ]
    for token, why in refused:
        with pytest.raises(Unauthorized, match=why):
            keyed.verify(token)


def test_es256_and_rs256_from_a_jwks_file_are_picked_by_kid(tmp_path: Path, rsa_key: Key, ec_key: Key) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [
        jwk(rsa_key, "r1", use="sig"), jwk(ec_key, "e1"),
        {"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "kid": "o1"},  # a shared secret: never used
        jwk(rsa_key, "enc1", use="enc"),                                                    # an encryption key: skipped
    ]}))
    keyed = load_verifier(Settings(jwks_file=jwks))
    assert keyed is not None
    assert keyed.verify(signed(rsa_key, "RS256", kid="r1")).owner.sub == "alice"
    assert keyed.verify(signed(ec_key, "ES256", kid="e1")).owner.sub == "alice"
    for token, why in [
        (signed(ec_key, "ES256", kid="r1"), "algorithm not accepted"),     # another key's kid
        (signed(rsa_key, "RS256", kid="nope"), "unknown signing key"),
        (signed(rsa_key, "RS256"), "unknown signing key"),                 # no kid, several keys
        (signed(rsa_key, "RS256", kid="enc1"), "unknown signing key"),
        (jwt.encode({"sub": "a", "tenant": "t", "iat": 1, "exp": 2}, "secret-secret-secret-secret-secret",
                    algorithm="HS256", headers={"kid": "o1"}), "unknown signing key"),
    ]:
        with pytest.raises(Unauthorized, match=why):
            keyed.verify(token)


def test_a_jwks_of_one_key_accepts_a_token_without_kid(tmp_path: Path, ec_key: Key) -> None:
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [jwk(ec_key, None)]}))
    keyed = load_verifier(Settings(jwks_file=tmp_path / "jwks.json"))
    assert keyed is not None and keyed.verify(signed(ec_key, "ES256")).owner.sub == "alice"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (lambda rsa_key: "{not json", "is not JSON"),
        (lambda rsa_key: json.dumps({"no": "keys"}), "is not a JWKS"),
        (lambda rsa_key: json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ", "kid": "o"}]}),
         "holds no RS256 or ES256 signing key"),
        (lambda rsa_key: json.dumps({"keys": [jwk(rsa_key, "a"), jwk(rsa_key, "a")]}), "two keys share a `kid`"),
        (lambda rsa_key: json.dumps({"keys": [jwk(rsa_key, "a"), jwk(rsa_key, None)]}), "every key needs a `kid`"),
        (lambda rsa_key: json.dumps({"keys": [jwk(rsa.generate_private_key(public_exponent=65537, key_size=1024), "w")]}),
         "an RSA key of 1024 bits"),
    ],
    ids=["not-json", "not-a-jwks", "only-a-shared-secret", "duplicate-kid", "missing-kid", "weak-rsa"],
)
def test_an_unusable_jwks_file_refuses_to_start(
    tmp_path: Path, rsa_key: Key, content: Callable[[Key], str], why: str
) -> None:
    (tmp_path / "jwks.json").write_text(content(rsa_key))
    with pytest.raises(AuthConfigError, match=why) as info:
        load_verifier(Settings(jwks_file=tmp_path / "jwks.json"))
    assert "c2VjcmV0" not in str(info.value)  # never a key's material


def test_an_unusable_public_key_file_refuses_to_start(tmp_path: Path, rsa_key: Key) -> None:
    with pytest.raises(AuthConfigError, match="cannot read REACTGATE_JWT_PUBLIC_KEY_FILE"):
        load_verifier(Settings(jwt_public_key_file=tmp_path / "missing.pem"))
    private = rsa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    (tmp_path / "private.pem").write_bytes(private)
    with pytest.raises(AuthConfigError, match="is not a PEM public key"):
        load_verifier(Settings(jwt_public_key_file=tmp_path / "private.pem"))
    p384 = ec.generate_private_key(ec.SECP384R1())
    (tmp_path / "p384.pem").write_bytes(pem(p384))
    with pytest.raises(AuthConfigError, match=r"only RSA \(RS256\) and P-256 \(ES256\) keys"):
        load_verifier(Settings(jwt_public_key_file=tmp_path / "p384.pem"))


# -- origins -----------------------------------------------------------------------------------------------

ANONYMOUS_POLICY = OriginPolicy.from_settings(Settings())
AUTH_POLICY = OriginPolicy.from_settings(
    Settings(auth_secret=SecretStr(SECRET), allowed_origins="https://app.example, http://admin.example:8080")
)


@pytest.mark.parametrize(
    ("origin", "host", "anonymous", "with_auth"),
    [
        (None, "gw:8765", True, True),                                      # not a browser
        ("http://127.0.0.1:8765", "127.0.0.1:8765", True, True),            # the console on loopback
        ("http://localhost:3000", "127.0.0.1:8765", True, False),
        ("https://[::1]", "127.0.0.1:8765", True, False),
        ("http://127.9.9.9:1", "127.0.0.1:8765", True, False),
        ("https://evil.example", "127.0.0.1:8765", False, False),
        ("http://evil.example:8765", "evil.example:8765", False, True),    # rebinding: same origin, token still needed
        ("null", "127.0.0.1:8765", False, False),
        ("http://localhost.evil.example", "127.0.0.1:8765", False, False),
        ("https://app.example", "gw.example", False, True),
        ("https://app.example:443", "gw.example", False, True),
        ("http://app.example", "gw.example", False, False),               # another scheme: another origin
        ("http://admin.example:8080", "gw.example", False, True),
        ("http://admin.example", "gw.example", False, False),             # another port
        ("https://gw.example", "gw.example", False, True),                # the console behind TLS
        ("https://gw.example", "gw.example:8443", False, False),
        ("http://gw.example:8765", "GW.example:8765", False, True),
        ("ftp://gw.example", "gw.example", False, False),
        ("https://gw.example/path", "gw.example", False, False),
    ],
)
def test_which_origins_may_open_a_websocket(origin: str | None, host: str, anonymous: bool, with_auth: bool) -> None:
    origins = [] if origin is None else [origin]
    assert ANONYMOUS_POLICY.allows(origins, host) is anonymous
    assert AUTH_POLICY.allows(origins, host) is with_auth


def test_two_origin_headers_are_refused() -> None:
    assert not ANONYMOUS_POLICY.allows(["http://127.0.0.1:1", "http://127.0.0.1:1"], "127.0.0.1:1")


def test_allowed_origins_come_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACTGATE_ALLOWED_ORIGINS", "https://a.example, https://b.example:8443 ,")
    assert Settings().allowed_origins == ("https://a.example", "https://b.example:8443")


def test_unusable_allowed_origins_refuse_to_start() -> None:
    with pytest.raises(OriginConfigError, match=re.escape("'https://a.example/app' is not an origin")):
        OriginPolicy.from_settings(Settings(auth_secret=SecretStr(SECRET), allowed_origins="https://a.example/app"))
    with pytest.raises(OriginConfigError, match="REACTGATE_ALLOWED_ORIGINS needs auth configured"):
        OriginPolicy.from_settings(Settings(allowed_origins="https://a.example"))
