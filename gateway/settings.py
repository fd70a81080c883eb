"""Gateway settings (README.md#configuration): pydantic-settings, environment prefix `REACTGATE_`.

`auth_secret` is a `SecretStr`: its value never appears in a repr, a log line or an error.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="REACTGATE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    backend: Literal["ray", "local"] = "ray"
    # The agents served (docs/design.md#several-agents): profile files, or directories of `*.toml`
    # profiles, in order — REACTGATE_AGENT=a.toml,b.toml or a directory; none, the built-in demo.
    # The first agent is the default (of `open` without `agent`) unless `default_agent` names one.
    agent: Annotated[tuple[Path, ...], NoDecode] = ()
    default_agent: str | None = None
    script: Path | None = None
    model: str | None = None
    store: str = "sqlite:///./data/reactgate.sqlite3"
    ray_address: str | None = None
    # The Ray backend's cluster shape (gateway/app.py puts both into the RayConfig): `hosts` is the
    # number of sharded ConversationHosts (REACTGATE_HOSTS), not the bind address `host` above;
    # `ray_cpus` is num_cpus of a Ray this process starts when `ray_address` is unset.
    hosts: int = Field(default=2, gt=0)
    ray_cpus: int = Field(default=2, gt=0)
    # A custom Ray resource only the nodes meant for reactgate's actors offer (RayConfig.actor_resource;
    # k8s/raycluster.yaml's worker group). Unset: actors run wherever Ray puts them.
    ray_actor_resource: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")
    # Who may connect (gateway/auth.py, README.md#security). Tokens are verified with exactly one
    # key source: the HS256 `auth_secret`, or an RS256/ES256 public key (a PEM file, or a JWKS file
    # whose keys are picked by `kid`). Any of them counts as "auth configured" for `check_bind`.
    auth_secret: SecretStr | None = None
    jwt_public_key_file: Path | None = None
    jwks_file: Path | None = None
    jwt_issuer: str | None = None            # required `iss` when set
    jwt_audience: str | None = None          # required `aud` when set; unset, a token with `aud` is refused
    max_token_ttl_s: float = Field(default=86_400.0, gt=0)  # caps `exp - iat`
    # Browser origins allowed with auth configured, comma-separated exact origins
    # (REACTGATE_ALLOWED_ORIGINS=https://app.example,https://admin.example). Without auth only
    # loopback origins are; the console's own origin (Origin == the request's Host) always is.
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = ()
    # The token claims a tool may read as `ToolContext.caller.claims`, besides tenant and sub
    # (REACTGATE_TOOL_CLAIMS=roles,org_id). None by default: a tool never sees the token itself.
    tool_claims: Annotated[tuple[str, ...], NoDecode] = ()
    # The MCP face (docs/design.md#mcp-face): the token claim that names a client's access mode
    # (`observe` or `execute`); a token without it gets its agent profile's `[mcp_face] access`.
    mcp_access_claim: str = Field(default="reactgate_access", min_length=1)

    @field_validator("allowed_origins", "tool_claims", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("agent", mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        if isinstance(value, Path):
            return (value,)
        if isinstance(value, str):
            return tuple(Path(part.strip()) for part in value.split(",") if part.strip())
        return value

    @property
    def auth_configured(self) -> bool:
        """A token is required: a secret, a public key or a JWKS file is set."""
        return self.auth_secret is not None or self.jwt_public_key_file is not None or self.jwks_file is not None

    max_frame_bytes: int = Field(default=256 * 1024, gt=0)
    send_queue_frames: int = Field(default=2000, gt=0)
    rate_per_s: float = Field(default=20.0, gt=0)
    rate_burst: int = Field(default=50, gt=0)
    max_connections: int = Field(default=10_000, gt=0)
    # Load shedding (docs/design.md#overload): while the event loop's timers fire this late, or while
    # 5% of the live events reach their connections' queues later than overload_delivery_ms after
    # they were made (each smoothed over about a second), new handshakes and requests get 503 with
    # Retry-After; open ones are kept.
    # 0: that signal never refuses (both are still measured, in /metrics).
    overload_lag_ms: float = Field(default=100.0, ge=0)
    overload_delivery_ms: float = Field(default=250.0, ge=0)
    max_conversations_per_connection: int = Field(default=64, gt=0)
    bad_frames_before_close: int = Field(default=10, gt=0)
    drain_grace_s: float = Field(default=25.0, gt=0)
    idle_ttl_s: float = Field(default=600.0, gt=0)
    # How long a conversation waits for a store that went away before it is deactivated; it
    # recovers from the store at its next activation (docs/design.md#store-outage).
    store_outage_s: float = Field(default=120.0, gt=0)
    # The gateway process's event loop: uvloop (libuv's loop) wherever it is installed — the default
    # install has it on Linux and macOS — else asyncio's own; `asyncio` forces the standard loop
    # (bench/README.md#event-loop measures the two on the same load).
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    # permessage-deflate: ~64 KiB of memory per connection instead of ~14 KiB (measured); off by default
    compression: bool = False
    # OpenTelemetry (docs/design.md#tracing): a collector's OTLP/HTTP base URL, e.g.
    # http://otel-collector:4318; unset, OTEL_EXPORTER_OTLP_ENDPOINT is used; neither: no tracing.
    otlp_endpoint: str | None = None
    # Quotas per user and per tenant (docs/design.md#quotas; the table: actors/quotas.py QUOTAS).
    # 0: no limit (still counted). Enforced by the hosts and the backends, not only this gateway.
    quota_open_conversations_per_user: int = Field(default=1_000, ge=0)
    quota_open_conversations_per_tenant: int = Field(default=100_000, ge=0)
    quota_concurrent_turns_per_user: int = Field(default=16, ge=0)
    quota_concurrent_turns_per_tenant: int = Field(default=1_000, ge=0)
    quota_turns_per_minute_per_user: int = Field(default=120, ge=0)
    quota_turns_per_minute_per_tenant: int = Field(default=6_000, ge=0)
    quota_tokens_per_day_per_user: int = Field(default=5_000_000, ge=0)
    quota_tokens_per_day_per_tenant: int = Field(default=200_000_000, ge=0)
    quota_tool_calls_per_turn: int = Field(default=50, ge=0)
    quota_connections_per_ip: int = Field(default=256, ge=0)      # per replica
    quota_connections_per_user: int = Field(default=64, ge=0)     # per replica
    quota_metrics_interval_s: float = Field(default=15.0, gt=0)   # /metrics reads the counters this often


class BindRefused(ValueError):
    """Binding a non-loopback address without auth configured would serve anonymous users."""


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`. Empty or wildcard hosts are not loopback."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings) -> None:
    """Refuse to start on a non-loopback address without auth configured (a secret, a public key or
    a JWKS file: `Settings.auth_configured`; docs/wire-protocol.md#authentication)."""
    if not settings.auth_configured and not is_loopback(settings.host):
        raise BindRefused(
            f"refusing to bind {settings.host!r} without an auth secret or a JWT public key: anonymous "
            "access is only served on a loopback address (127.0.0.0/8, ::1, localhost). Set "
            "REACTGATE_AUTH_SECRET (or --auth-secret), REACTGATE_JWT_PUBLIC_KEY_FILE or "
            "REACTGATE_JWKS_FILE, or bind 127.0.0.1."
        )
