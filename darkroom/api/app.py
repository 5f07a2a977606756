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

from darkroom import logs
from darkroom.api import problems
from darkroom.api.auth import KeyCache
from darkroom.api.metrics import MetricsMiddleware, RequestMetrics
from darkroom.api.routes import router
from darkroom.api.schemas import ProblemDoc
from darkroom.config import Settings
from darkroom.db.connection import database_url, open_pool
from darkroom.db.migrations import migrate
from darkroom.queue import Queue
from darkroom.services import open_checked_store
from darkroom.storage import ObjectStore
from darkroom.uploads import Uploads

log = logging.getLogger(__name__)

STATIC_DIR = resources.files("darkroom.api").joinpath("static")


class _Server(uvicorn.Server):
    """uvicorn re-raises a caught SIGTERM after its graceful shutdown, which ends the
    process as killed by it; a shutdown that went as planned should exit 0 instead."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM and sig in self._captured_signals:
            self._captured_signals.remove(sig)


def create_app(
    settings: Settings, *, store: ObjectStore | None = None, fail_fast: bool = True
) -> FastAPI:
    """The API. `store` replaces the configured store (tests inject faulty ones)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = database_url(settings)
        app.state.store = store or await to_thread.run_sync(open_checked_store, settings)
        await to_thread.run_sync(migrate, url)  # under an advisory lock: safe in parallel
        pool = await open_pool(url, min_size=2, max_size=16, name="api", fail_fast=fail_fast)
        app.state.pool = pool
        app.state.queue = Queue.from_settings(pool, settings)
        app.state.uploads = Uploads(pool)
        # What start-up allocated (FastAPI, pydantic, boto3: ~84k objects) lives as long
        # as the process. Left to the collector, each full pass walks all of it while every
        # request waits (38-47 ms here, bench/api.py); frozen, a full pass walks only what
        # requests have allocated since.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await pool.close()

    app = FastAPI(
        title="darkroom",
        version="1",
        summary="Upload originals; WebP derivatives are made in the background.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = RequestMetrics()
    app.state.key_cache = KeyCache(settings.key_cache_seconds)
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
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app


def serve(settings: Settings, *, host: str, port: int) -> int:
    """`darkroom api`: checks everything first so a bad start is one line and exit 2."""
    logs.setup()
    # The pre-flight's own failure is the one line the operator gets (via ConfigError);
    # the store's warnings about the same failure would only repeat it as noise.
    quiet = logging.getLogger("darkroom.storage")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        store = open_checked_store(settings)
    finally:
        quiet.setLevel(level)
    migrate(database_url(settings))  # an unreachable database raises here, one line
    app = create_app(settings, store=store, fail_fast=False)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        timeout_graceful_shutdown=10,
        lifespan="on",
    )
    server = _Server(config)
    # uvicorn stops accepting on SIGTERM/SIGINT and lets in-flight requests finish.
    server.run()
    if not server.started:
        return 1
    return 0
