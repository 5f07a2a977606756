"""The API's routes, one module per resource: `uploads` (create, upload, confirm),
`files` (a caller's cards), `events` (the live feed), `queue` (the admin's queue),
`metrics`, `health`. Each translates; what they do is in the modules below `api/`."""

from __future__ import annotations

from fastapi import APIRouter

from darkroom.api.routes import events, files, health, metrics, queue, uploads

router = APIRouter()
for resource in (uploads, files, events, queue, metrics, health):
    router.include_router(resource.router)
