"""`/healthz` (the process answers) and `/readyz` (its database and object store do)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from darkroom.api.deps import StoreDep
from darkroom.api.problems import documented, problem_response
from darkroom.api.schemas import Health

log = logging.getLogger(__name__)

router = APIRouter(tags=["operations"])

READY_TIMEOUT = 3.0

# Readiness checks given up on, still finishing: held so they are not collected mid-way.
_ABANDONED: set[asyncio.Task[None]] = set()


async def _within(check: Coroutine[Any, Any, None], seconds: float) -> None:
    """`check`, or TimeoutError after `seconds` even if cancelling it takes longer.

    asyncio.wait_for waits for the cancelled check to end, and cancelling a statement to
    a partitioned server waits on that server too (measured: 13 s instead of 3). The
    probe answers on time; the abandoned check ends on its own.
    """
    task = asyncio.ensure_future(check)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        _ABANDONED.add(task)
        task.add_done_callback(_ABANDONED.discard)
        raise TimeoutError
    task.result()


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: documented("The database or the object store is unreachable.")},
    summary="Readiness: database and object store reachable",
)
async def readyz(request: Request, store: StoreDep) -> Response:
    checks: dict[str, str] = {}

    async def database() -> None:
        await request.app.state.db.ping(READY_TIMEOUT)

    async def storage() -> None:
        await to_thread.run_sync(store.check)

    for name, probe in (("database", database), ("storage", storage)):
        try:
            await _within(probe(), READY_TIMEOUT)
            checks[name] = "ok"
        except Exception as exc:
            log.warning(
                "readiness check failed", extra={"check": name, "error": type(exc).__name__}
            )
            checks[name] = "unavailable"
    if all(v == "ok" for v in checks.values()):
        return JSONResponse(Health(status="ready", checks=checks).model_dump())
    return problem_response(
        503, "not_ready_to_serve", "A dependency is unavailable.", checks=checks
    )
