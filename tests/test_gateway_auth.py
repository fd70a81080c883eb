"""gateway/auth.py and gateway/settings.py: who is calling, and where the server may listen."""

from __future__ import annotations

import logging
import time

import jwt
import pytest
from pydantic import SecretStr

from actors.hosting.backend import Owner
from gateway.auth import ANONYMOUS, Unauthorized, authenticate, token_from
from gateway.settings import BindRefused, Settings, check_bind, is_loopback

SECRET = "unit-test-secret-" * 4  # 68 bytes: long enough for HS512 too


def make(exp_in: float | None = 60, **claims: object) -> str:
    payload: dict[str, object] = {"sub": "alice", "tenant": "acme", **claims}
    if exp_in is not None:
        payload["exp"] = int(time.time() + exp_in)
    return jwt.encode(payload, SECRET, algorithm="HS256")


def test_bearer_header_gives_the_owner() -> None:
    owner = authenticate({"Authorization": f"Bearer {make()}"}, "", SecretStr(SECRET))
    assert owner == Owner(tenant="acme", sub="alice")


def test_query_token_gives_the_owner() -> None:
    assert authenticate({}, f"a=1&token={make()}", SECRET) == Owner(tenant="acme", sub="alice")
    assert authenticate({}, {"token": make()}, SECRET) == Owner(tenant="acme", sub="alice")


def test_the_header_wins_over_the_query() -> None:
    assert token_from({"Authorization": "bearer H"}, "token=Q") == "H"
    assert token_from({"Authorization": "Basic xyz"}, "token=Q") == "Q"
    assert token_from({}, "") is None


def test_no_secret_means_anonymous_local() -> None:
    assert authenticate({}, "", None) == ANONYMOUS == Owner(tenant="local", sub="local")


def test_a_token_without_exp_is_accepted() -> None:
    assert authenticate({}, {"token": make(exp_in=None)}, SECRET).sub == "alice"


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (None, "missing token"),
        ("garbage", "invalid token"),
        (make(exp_in=-1), "token expired"),
        (jwt.encode({"sub": "a", "tenant": "t"}, "x" * 40, algorithm="HS256"), "invalid token"),
        (jwt.encode({"sub": "a", "tenant": "t"}, SECRET, algorithm="HS512"), "invalid token"),
        (jwt.encode({"sub": "a"}, SECRET, algorithm="HS256"), "'tenant'"),
        (jwt.encode({"tenant": "t"}, SECRET, algorithm="HS256"), "'sub'"),
        (jwt.encode({"sub": "a", "tenant": ""}, SECRET, algorithm="HS256"), "non-empty"),
        (jwt.encode({"sub": "a", "tenant": 5}, SECRET, algorithm="HS256"), "non-empty"),
    ],
)
def test_refused_tokens_are_unauthorized_and_never_echoed(
    token: str | None, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Unauthorized, match=why) as info:
        authenticate({}, {"token": token} if token else {}, SECRET)
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
