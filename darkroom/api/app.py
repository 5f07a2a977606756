"""The HTTP API application: `create_app(settings)` and `serve(...)` for `darkroom api`."""

from __future__ import annotations

import gc
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from types import FrameType
from typing import Any

import uvicorn
from anyio import to_thread
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from darkroom import logs
from darkroom.api import problems
from darkroom.api.auth import KeyCache, UnknownKeys
from darkroom.api.events import Hub
from darkroom.api.limits import BodyLimit, RateLimiter, SecurityHeaders, origin_of, security_headers
from darkroom.api.metrics import (
    MetricsMiddleware,
    RequestMetrics,
    StatsCache,
    on_metrics_listener,
)
from darkroom.api.problems import problem_response
from darkroom.api.routes import router
from darkroom.api.schemas import ProblemDoc
from darkroom.api.server import Wire, listen, uvicorn_config
from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.database import Database
from darkroom.files import Files
from darkroom.queue import Queue
from darkroom.reads import Reads
from darkroom.services import start
from darkroom.storage import ObjectStore, open_store

log = logging.getLogger(__name__)

STATIC_DIR = resources.files("darkroom.api").joinpath("static")

# How long a request waits for one of the pool's connections. While the database is
# unreachable the pool cannot replace the connections the outage broke, and a request
# would otherwise queue for psycopg_pool's 30 s: it answers 503 database_unavailable
# instead, so a call lasts at most this wait plus the connections' own bound on an
# unanswered statement (connection.SESSION_OPTIONS' TCP user timeout).
CONNECTION_WAIT_SECONDS = 5.0


class _Server(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM after its graceful shutdown, which ends the
    process as killed by it; a shutdown that went as planned should exit 0 instead."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # Open event streams never end by themselves: end them now, or the graceful
        # shutdown would wait its whole timeout for them. The pages reconnect elsewhere.
        hub = getattr(getattr(self.config.app, "state", None), "hub", None)
        if hub is not None:
            hub.close()
        if sig == signal.SIGTERM and sig in self._captured_signals:
            self._captured_signals.remove(sig)


def create_app(
    settings: Settings, *, store: ObjectStore | None = None, fail_fast: bool = True
) -> FastAPI:
    """The API. `store` replaces the configured store (tests inject faulty ones)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if store is None:
            url, app.state.store = await to_thread.run_sync(start, settings)
        else:  # started already (`serve`), or a store the tests inject
            url, app.state.store = database_url(settings), store
        db = await Database.open(url, min_size=2, max_size=16, name="api", fail_fast=fail_fast,
                                 wait_seconds=CONNECTION_WAIT_SECONDS)
        app.state.db = db
        app.state.queue = Queue.from_settings(db, settings)
        app.state.reads = Reads(db)
        app.state.hub = Hub(
            db, ping_seconds=settings.events_ping_seconds,
            max_per_owner=settings.events_max_streams_per_owner,
            max_seconds=settings.events_max_seconds,
            # A stream's key is looked up again as often as a request's would be.
            recheck_seconds=max(settings.key_cache_seconds, 0.5))
        app.state.files = Files(app.state.queue, app.state.store, settings)
        # What start-up allocated (FastAPI, pydantic, boto3: ~84k objects) lives as long
        # as the process. Left to the collector, each full pass walks all of it while every
        # request waits (38-47 ms here, bench/api.py); frozen, a full pass walks only what
        # requests have allocated since.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            app.state.hub.close()
            await db.close()

    app = FastAPI(
        title="darkroom",
        version="1",
        summary="Upload originals; WebP derivatives are made in the background.",
        lifespan=lifespan,
        # Swagger UI loads its code from a CDN, on the origin where the page keeps the
        # key: off unless the operator asks for it.
        docs_url="/docs" if settings.api_docs else None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = RequestMetrics()
    app.state.key_cache = KeyCache(settings.key_cache_seconds)
    app.state.unknown_keys = UnknownKeys(settings.unknown_key_rate_per_minute)
    app.state.creations = RateLimiter(settings.create_rate_per_minute)
    app.state.stats_cache = StatsCache(settings.metrics_cache_seconds)
    headers = security_headers(_store_origin(settings, store))
    app.state.wire = Wire(
        read_timeout=settings.api_read_timeout_seconds, headers=headers,
        max_connections=settings.api_max_connections,
        max_connections_per_client=settings.api_max_connections_per_client,
        min_body_bytes_per_second=settings.api_min_body_bytes_per_second,
        trusted_proxies=tuple(settings.trusted_proxy_list))
    problems.install(app)
    app.include_router(router)

    static = StaticFiles(directory=str(STATIC_DIR))
    app.mount("/static", static, name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(
            str(STATIC_DIR.joinpath("index.html")), headers={"Cache-Control": "no-cache"}
        )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            # The problem document every error answers; routes refer to it by name.
            doc = ProblemDoc.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(doc.pop("$defs", {}))
            components["Problem"] = doc
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    # Outermost last: the headers go on every answer, the request is counted, and a body
    # over its limit is refused before routing, keys or parsing.
    app.add_middleware(BodyLimit, upload_limit=settings.max_upload_bytes)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    app.add_middleware(MetricsListenerOnly)
    # Outside even Starlette's own error middleware, so a 500 carries the headers too.
    build = app.build_middleware_stack
    app.build_middleware_stack = (  # type: ignore[method-assign]
        lambda: SecurityHeaders(build(), headers=headers))
    return app


def _store_origin(settings: Settings, store: ObjectStore | None) -> str | None:
    """The origin of the store's presigned URLs, which the page fetches derivatives from
    (None for the local store: the API serves the bytes itself). Signing is local: the
    store is not contacted."""
    try:
        store = store or open_store(settings.resolved_storage_url)
        return origin_of(store.presign_get("originals/origin-probe", "probe", expires=60))
    except Exception:  # no credentials yet: the start-up check will say so, in one line
        return None


class MetricsListenerOnly:
    """The metrics listener answers /metrics and nothing else."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["path"] != "/metrics"
                and on_metrics_listener(scope)):
            await problem_response(404, "not_found", "No such resource.")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def server_config(app: FastAPI, *, host: str = "127.0.0.1", port: int = 0) -> uvicorn.Config:
    """The uvicorn settings of an API process, from the app's settings."""
    settings: Settings = app.state.settings
    return uvicorn_config(app, wire=app.state.wire, max_connections=settings.api_max_connections,
                          host=host, port=port)


def serve(settings: Settings, *, host: str, port: int) -> int:
    """`darkroom api`: checks everything first so a bad start is one line and exit 2."""
    logs.setup()
    # The pre-flight's own failure is the one line the operator gets (via ConfigError);
    # the store's warnings about the same failure would only repeat it as noise.
    quiet = logging.getLogger("darkroom.storage")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        _, store = start(settings)
    finally:
        quiet.setLevel(level)
    if settings.api_metrics_port and settings.api_metrics_port == port:
        raise ConfigError("DARKROOM_API_METRICS_PORT must differ from the API's port")
    app = create_app(settings, store=store, fail_fast=False)
    config = server_config(app, host=host, port=port)
    sockets = [listen(host, port)]
    if settings.api_metrics_port:
        sockets.append(listen(settings.api_metrics_host, settings.api_metrics_port))
    server = _Server(config)
    # uvicorn stops accepting on SIGTERM/SIGINT and lets in-flight requests finish.
    server.run(sockets=sockets)
    if not server.started:
        return 1
    return 0
