"""`/metrics`: Prometheus text, on the API's port for an admin key, or on the metrics
listener (`DARKROOM_API_METRICS_PORT`) for anyone who can reach it. What is measured is
`api/metrics.py`'s."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from darkroom.api.auth import admin, bearer, principal
from darkroom.api.deps import DbDep
from darkroom.api.metrics import CONTENT_TYPE, StatsCache, on_metrics_listener, render
from darkroom.api.problems import problems

router = APIRouter(tags=["operations"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text format.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **problems(401, 403),
    },
    summary="Prometheus metrics (admin key, or the metrics listener)",
)
async def metrics(request: Request, db: DbDep) -> Response:
    if not on_metrics_listener(request.scope):
        # On the API's port the figures are an admin's, as /v1/queue is.
        await admin(await principal(request, await bearer(request)))
    cache: StatsCache = request.app.state.stats_cache
    figures = await cache.get(db)
    return Response(render(request.app.state.metrics, figures), media_type=CONTENT_TYPE)
