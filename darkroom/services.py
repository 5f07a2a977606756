"""The one start-up path of every long-running process (`api`, `worker`, `sweep`, and
`up` for all three): open the object store, checked to be reachable and configured as
darkroom needs (bucket versioning Enabled), and bring the database's schema up to date.
A problem is one `ConfigError` line, never a traceback.

Migrations run once per standalone process start, and once per `darkroom up`: `up`
applies them itself and tells its children (DARKROOM_SCHEMA_READY) not to again.
"""

from __future__ import annotations

import asyncio

from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.migrations import migrate
from darkroom.errors import StorageError
from darkroom.storage import ObjectStore, open_store
from darkroom.storage.local import private_dir


def open_checked_store(settings: Settings) -> ObjectStore:
    try:
        store = open_store(settings.resolved_storage_url,
                           timeout=settings.storage_timeout_seconds)
        store.check()
    except StorageError as exc:  # including StorageConfigError and StorageUnavailable
        raise ConfigError(f"DARKROOM_STORAGE_URL: {exc}") from None
    return store


SCHEMA_READY_ENV = "DARKROOM_SCHEMA_READY"


def start(settings: Settings) -> tuple[str, ObjectStore]:
    """The database's conninfo (migrated; safe in parallel) and the checked store.

    The data dir is checked first (by the embedded database's start, or here when the
    database is elsewhere and the store is the data dir's own): the store's check makes
    and narrows its directory, which must be darkroom's before anything is changed in
    it, or a link another user planted there would take the change elsewhere."""
    conninfo = database_url(settings)
    if settings.storage_url is None and settings.database_url is not None:
        private_dir(settings.data_path)
    store = open_checked_store(settings)
    if not settings.schema_ready:
        migrate(conninfo)  # an unreachable database raises here, one line
    return conninfo, store


async def prepare(settings: Settings) -> tuple[str, ObjectStore]:
    """`start`, off the event loop."""
    return await asyncio.to_thread(start, settings)
