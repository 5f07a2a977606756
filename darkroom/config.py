"""Configuration: every `DARKROOM_*` variable, validated once at start.

A bad value must end the process with one readable line (exit code 2), so validation
errors are turned into `ConfigError` whose message names the variable, never a traceback.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConfigError(Exception):
    """A configuration value is unusable; the message is one line for the operator."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DARKROOM_", extra="ignore", frozen=True)

    database_url: str | None = None
    storage_url: str | None = None
    data_dir: Path = Path(".darkroom")

    lease_seconds: float = Field(120.0, gt=0, le=86_400)
    max_attempts: int = Field(3, ge=1, le=100)
    retry_base_seconds: float = Field(30.0, ge=0, le=86_400)
    retry_cap_seconds: float = Field(3_600.0, ge=0, le=7 * 86_400)
    max_upload_bytes: int = Field(25_000_000, ge=1)
    max_pixels: int = Field(50_000_000, ge=1)
    max_dimension: int = Field(16_384, ge=1)
    derivative_max_edge: int = Field(2_048, ge=16, le=16_384)
    shutdown_grace_seconds: float = Field(30.0, ge=0, le=3_600)

    # An attempt's whole life: fetch, decode, store, commit. Past it the attempt is given
    # up and its card goes back to the queue (transient, with backoff), so a stalled store
    # or a half-open database connection cannot hold a card or a slot for ever.
    attempt_timeout_seconds: float = Field(300.0, gt=0, le=86_400)

    # How long an idle worker waits before polling when no NOTIFY arrives.
    poll_seconds: float = Field(2.0, gt=0, le=3_600)
    # Time limit and address-space limit of one decode in its child process.
    derive_timeout_seconds: float = Field(60.0, gt=0, le=3_600)
    derive_memory_mb: int = Field(1_024, ge=64)
    # Added to the decoder children's niceness. Derivation is throughput work; on a host
    # it shares with the API, requests should not queue behind it. Alone on a machine a
    # nice process runs as fast as any other, so the default costs nothing there.
    derive_nice: int = Field(10, ge=0, le=19)
    # The sweeper leaves orphans and deleted files alone this long, so that a slow
    # reader of a presigned URL or an attempt finishing its PUT is not cut off.
    sweep_guard_seconds: float = Field(300.0, ge=0)
    sweep_interval_seconds: float = Field(30.0, gt=0)
    # Finished rows' events are kept this long (the card itself stays).
    event_retention_days: float = Field(7.0, gt=0)
    # An open page's event stream carries a ping this often when nothing else happens.
    events_ping_seconds: float = Field(15.0, gt=0, le=3_600)
    # One owner's open event streams per API process; a new one ends the oldest.
    events_max_streams_per_owner: int = Field(8, ge=1, le=1_000)
    # A stream's longest life; the page reconnects at once and re-reads what it shows.
    events_max_seconds: float = Field(900.0, gt=0, le=86_400)

    # How long the API trusts a key it has looked up before looking it up again: a key
    # revoked in the database stops working within this time. 0 looks up every request.
    key_cache_seconds: float = Field(5.0, ge=0, le=3_600)

    # --- facing the internet (docs/SECURITY.md) ---
    # Unconfirmed cards and their bytes are removed this long after creation.
    pending_ttl_seconds: float = Field(86_400.0, gt=0)
    # Per owner: declared bytes and number of live cards (0: no quota).
    owner_quota_bytes: int = Field(0, ge=0)
    owner_quota_files: int = Field(0, ge=0)
    # The API's public origin (https://photos.example.net) for the absolute URLs it
    # hands out; unset, they are relative. Never taken from a request's Host header.
    public_url: str | None = None
    # Card creations per key per minute, per API process (0: no limit).
    create_rate_per_minute: int = Field(600, ge=0)
    # Requests with a key this process does not know, per client address per minute:
    # each costs a database lookup, so past this an address is answered 429 unlooked.
    unknown_key_rate_per_minute: int = Field(30, ge=1)
    # Connections one API process holds at once; past it, new requests get 503.
    api_max_connections: int = Field(1_000, ge=1)
    # Connections one client address (an IPv6 /64) holds at once; past it, new ones are
    # answered 503 and closed. A trusted proxy's connections are not capped.
    api_max_connections_per_client: int = Field(64, ge=1)
    # A request body must arrive at this average rate at least (after the read timeout).
    api_min_body_bytes_per_second: int = Field(16 * 1024, ge=1)
    # Addresses or networks (comma-separated) whose X-Forwarded-For names the client.
    trusted_proxies: str = ""
    # A request's head must arrive within this, and its body may pause no longer.
    api_read_timeout_seconds: float = Field(15.0, gt=0, le=3_600)
    # /metrics without a key on this loopback port (0: only with an admin key on the API).
    api_metrics_port: int = Field(0, ge=0, le=65_535)
    api_metrics_host: str = "127.0.0.1"
    # The queue gauges of /metrics are read from the database at most this often.
    metrics_cache_seconds: float = Field(5.0, ge=0, le=3_600)
    # /docs (Swagger UI, loaded from its CDN) is off unless enabled.
    api_docs: bool = False

    # Set by `darkroom up` for the processes it starts: it has applied the migrations.
    schema_ready: bool = False

    api_url: str = "http://127.0.0.1:8000"
    api_key: str | None = None

    @field_validator("database_url", "storage_url", "api_key", "public_url", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("public_url")
    @classmethod
    def _public_origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query \
                or parts.fragment or parts.path not in ("", "/"):
            raise ValueError("must be an origin such as https://photos.example.net")
        return f"{parts.scheme}://{parts.netloc}"

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                ipaddress.ip_network(part, strict=False)
            except ValueError:
                raise ValueError("must be comma-separated IP addresses or networks") from None
        return ",".join(filter(None, (p.strip() for p in value.split(","))))

    @property
    def trusted_proxy_list(self) -> list[str]:
        return [p for p in self.trusted_proxies.split(",") if p]

    @field_validator("storage_url")
    @classmethod
    def _storage_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.startswith("file:///"):
            return value
        if value.startswith("s3://") and len(value) > len("s3://"):
            return value
        raise ValueError("must be file:///absolute/dir or s3://bucket[/prefix]")

    @field_validator("database_url")
    @classmethod
    def _database_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("postgresql://", "postgres://")) and "=" not in value:
            raise ValueError("must be a postgresql:// URL or a libpq key=value string")
        return value

    @property
    def data_path(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def resolved_storage_url(self) -> str:
        return self.storage_url or (self.data_path / "objects").as_uri()


def load_settings(**overrides: Any) -> Settings:
    """Read the environment (plus explicit overrides from flags) or raise `ConfigError`."""
    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        name = f"DARKROOM_{field.upper()}"
        got = error.get("input")
        shown = "" if got is None or isinstance(got, dict) else f" (got {str(got)[:60]!r})"
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"{name}: {message}{shown}") from None

