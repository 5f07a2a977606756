"""Configuration: every `DARKROOM_*` variable, validated once at start.

A bad value must end the process with one readable line (exit code 2), so validation
errors are turned into `ConfigError` whose message names the variable, never a traceback.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# An S3 request's wait for the store's next bytes, unless DARKROOM_STORAGE_TIMEOUT_SECONDS
# says otherwise.
STORAGE_TIMEOUT_SECONDS = 10.0


class ConfigError(Exception):
    """A configuration value is unusable; the message is one line for the operator."""


# Links followed when resolving a path before it is refused as a loop.
_MAX_LINKS = 40


def resolve_trusted(path: Path) -> Path:
    """`path` (absolute) with its links followed, refusing a link another user owns: the
    owner of a link chooses where it leads, so one planted where darkroom's data dir is
    to be (in /tmp, say) could hand root's darkroom /etc to make its own. Walked one name
    at a time, as the kernel does (`..` included), so no link is followed unchecked."""
    me = os.geteuid()
    current, rest, links = Path(path.anchor), list(path.parts[1:]), 0
    while rest:
        name = rest.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = current.parent  # `current` holds no link: its parent is the real one
            continue
        candidate = current / name
        try:
            st = os.lstat(candidate)
        except OSError:
            current = candidate  # missing: nothing to follow, but `..` may climb back
            continue
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        if st.st_uid not in (0, me):
            raise ConfigError(f"{candidate} is a link another user (uid {st.st_uid}) made; "
                              f"DARKROOM_DATA_DIR must not lead through it")
        links += 1
        if links > _MAX_LINKS:
            raise ConfigError(f"DARKROOM_DATA_DIR leads through too many links ({candidate})")
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            current = Path(target.anchor)
        rest = list(target.parts[1:] if target.is_absolute() else target.parts) + rest
    return current


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DARKROOM_", extra="ignore", frozen=True)

    database_url: str | None = Field(None,
        description=("PostgreSQL URL (with a standby: every host and "
                     "`target_session_attrs=read-write`, docs/OPERATIONS.md \"Database high "
                     "availability\"); unset: a private one in `$DARKROOM_DATA_DIR/pg` "
                     "(password, socket only)"),
        json_schema_extra={"shown": "embedded"})
    storage_url: str | None = Field(None,
        description="`file:///abs/dir` or `s3://bucket/prefix`",
        json_schema_extra={"shown": "`file://$DARKROOM_DATA_DIR/objects`"})
    storage_timeout_seconds: float = Field(STORAGE_TIMEOUT_SECONDS, gt=0, le=600,
        description=("an S3 request's wait for the store's next bytes (and at most 5 s for "
                     "its connection), before it is tried once more and then taken as the "
                     "store's failure, never the file's"))
    data_dir: Path = Field(Path(".darkroom"),
        description="local state: embedded database, local objects, the local key")

    lease_seconds: float = Field(120.0, gt=0, le=86_400,
        description="an attempt's lease; heartbeats renew it every third of it")
    max_attempts: int = Field(3, ge=1, le=100,
        description="a file is started at most this many times")
    retry_base_seconds: float = Field(30.0, ge=0, le=86_400,
        description="transient failures back off `base·2^(n-1)`, full jitter …")
    retry_cap_seconds: float = Field(3_600.0, ge=0, le=7 * 86_400, description="… capped here")
    # So that an import always moves (the rest of the claims go to interactive work first).
    bulk_share: float = Field(0.1, ge=0, le=1,
        description=("while interactive and bulk work are both due, bulk work gets at least "
                     "this share of the claims (0: only slots no interactive card wants)"))
    max_upload_bytes: int = Field(25_000_000, ge=1, description="larger uploads are refused (413)")
    max_pixels: int = Field(50_000_000, ge=1,
        description="larger images are rejected from their header (`image_too_large`)")
    max_dimension: int = Field(16_384, ge=1,
        description="a wider or taller image is rejected from its header")
    derivative_max_edge: int = Field(2_048, ge=16, le=16_384,
        description=("the preview's long edge; after a change, `darkroom rederive --all` "
                     "re-queues the cards made with the old one"))
    shutdown_grace_seconds: float = Field(30.0, ge=0, le=3_600,
        description="on SIGTERM, running jobs get this long before they are handed back")

    # An attempt's whole life: fetch, decode, store, commit. Past it the attempt is given
    # up and its card goes back to the queue (transient, with backoff), so a stalled store
    # or a half-open database connection cannot hold a card or a slot for ever.
    attempt_timeout_seconds: float = Field(300.0, gt=0, le=86_400,
        description=("an attempt's whole life (fetch, decode, store, commit); past it the "
                     "card is queued again"))
    # An attempt the object store failed is handed back with the attempt given back; one
    # failed while the store served other files between its tries is counted, and the
    # file is rejected storage_unavailable at this many. A store outage counts none.
    max_deferrals: int = Field(10, ge=1, le=1_000,
        description=("a file the store fails while serving others is rejected "
                     "`storage_unavailable` after this many deferrals; an outage counts none"))

    poll_seconds: float = Field(2.0, gt=0, le=3_600,
        description="idle workers poll this often (jittered) besides LISTEN/NOTIFY")
    # Time limit and address-space limit of one decode in its child process.
    derive_timeout_seconds: float = Field(60.0, gt=0, le=3_600,
        description="one decode's time limit in its child process")
    # Below 256 MB a child cannot hold its decoders' libraries, let alone an image.
    derive_memory_mb: int = Field(1_024, ge=256,
        description="one decoder child's address-space limit")
    # Added to the decoder children's niceness. Derivation is throughput work; on a host
    # it shares with the API, requests should not queue behind it. Alone on a machine a
    # nice process runs as fast as any other, so the default costs nothing there.
    derive_nice: int = Field(10, ge=0, le=19,
        description=("added to the decoder children's niceness: on a shared host, API "
                     "requests and the worker's heartbeats get the CPU first; alone on a "
                     "machine it costs nothing"))
    # The sweeper leaves orphans and deleted files alone this long, so that a slow
    # reader of a presigned URL or an attempt finishing its PUT is not cut off.
    sweep_guard_seconds: float = Field(300.0, ge=0,
        description="orphans and deleted files are left alone this long")
    sweep_interval_seconds: float = Field(30.0, gt=0,
        description="an idle sweeper unit looks for work this often (jittered)")
    event_retention_days: float = Field(7.0, gt=0,
        description="events older than this are pruned by the sweeper")
    events_ping_seconds: float = Field(15.0, gt=0, le=3_600,
        description=("an open page's status stream (`GET /v1/events`) sends a ping this "
                     "often when idle; keep it under any proxy's idle timeout"))
    events_max_streams_per_owner: int = Field(8, ge=1, le=1_000,
        description="open status streams per owner per API process; a new one ends the oldest")
    events_max_seconds: float = Field(900.0, gt=0, le=86_400,
        description="a status stream's longest life; the page reconnects at once and re-reads")

    # How long the API trusts a key it has looked up before looking it up again: a key
    # revoked in the database stops working within this time. 0 looks up every request.
    key_cache_seconds: float = Field(5.0, ge=0, le=3_600,
        description=("the API trusts a key it looked up for this long: a key revoked in the "
                     "database stops working within it (0: look up every request)"))

    # --- facing the internet (docs/SECURITY.md) ---
    pending_ttl_seconds: float = Field(86_400.0, gt=0,
        description="unconfirmed cards expire after this, with their bytes")
    owner_quota_bytes: int = Field(0, ge=0,
        description=("declared bytes of an owner's live cards; past it creation answers `403 "
                     "quota_exceeded` (0: none)"))
    owner_quota_files: int = Field(0, ge=0, description="live cards per owner, likewise (0: none)")
    # The API's public origin (https://photos.example.net) for the absolute URLs it
    # hands out; unset, they are relative. Never taken from a request's Host header.
    public_url: str | None = Field(None,
        description=("the API's public origin (`https://photos.example.net`) for absolute "
                     "URLs; unset, they are relative (never taken from `Host`)"))
    create_rate_per_minute: int = Field(600, ge=0,
        description="card creations per key per minute, per API process; past it `429` (0: none)")
    # Requests with a key this process does not know, per client address per minute:
    # each costs a database lookup, so past this they are looked up one at a time.
    unknown_key_rate_per_minute: int = Field(30, ge=1,
        description=("unknown keys per client address per minute, per API process (all "
                     "addresses: 10×); past it they are looked up one at a time and a miss "
                     "answers `429`; a key once found valid is never counted"))
    api_max_connections: int = Field(1_000, ge=1,
        description=("request connections per API process (event streams have a pool of "
                     "their own of this size); past it the idlest connection is closed to "
                     "make room, or, with all at work, `503`"))
    api_max_connections_per_client: int = Field(64, ge=1,
        description=("connections per client address (IPv6: per /64) per API process; past "
                     "it `503` and closed; trusted proxies exempt"))
    api_min_body_bytes_per_second: int = Field(16 * 1024, ge=1,
        description=("a request body must arrive at this average rate (after the read "
                     "timeout) or the connection is closed"))
    trusted_proxies: str = Field("", json_schema_extra={"shown": "none"},
        description=("addresses or networks (comma-separated) whose `X-Forwarded-For` names "
                     "the client; from anyone else it is ignored"))
    api_read_timeout_seconds: float = Field(15.0, gt=0, le=3_600,
        description=("a request's head must arrive within this (`408`), and its body may "
                     "pause no longer"))
    # /metrics without a key on this loopback port (0: only with an admin key on the API).
    api_metrics_port: int = Field(0, ge=0, le=65_535,
        description=("a listener serving only `/metrics`, without a key (0: none; on the "
                     "API's port `/metrics` needs an admin key)"))
    api_metrics_host: str = Field("127.0.0.1", description="… and its address")
    metrics_cache_seconds: float = Field(5.0, ge=0, le=3_600,
        description="the queue gauges of `/metrics` are read from the database at most this often")
    api_docs: bool = Field(False, description="serve `/docs` (Swagger UI, loaded from its CDN)")

    # Set by `darkroom up` for the processes it starts: it has applied the migrations.
    schema_ready: bool = False

    api_url: str = Field("http://127.0.0.1:8000", description="the API `darkroom import` talks to")
    api_key: str | None = Field(None,
        description="the key `darkroom import` uses (never taken from argv)")

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
        return resolve_trusted(self.data_dir.expanduser().absolute())

    @property
    def resolved_storage_url(self) -> str:
        return self.storage_url or (self.data_path / "objects").as_uri()


# Set by the services for each other; not a user's setting, so not in the table.
_INTERNAL = frozenset({"schema_ready"})


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, Path):
        return f"`{value}`"
    return str(value)


def settings_table() -> str:
    """The README's table of every setting, made from `Settings` so that it cannot drift
    (`make docs` writes it; a test fails when README.md differs)."""
    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        if name in _INTERNAL:
            continue
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        default = str(extra.get("shown", _shown(field.default)))
        lines.append(f"| `DARKROOM_{name.upper()}` | {default} | {field.description} |")
    return "\n".join(lines) + "\n"


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



if __name__ == "__main__":
    print(settings_table(), end="")
