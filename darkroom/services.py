"""What every long-running process does first: find the database, bring its schema up to
date, and open the object store, checked to be reachable and configured as darkroom needs
(bucket versioning Enabled). A problem is one `ConfigError` line, never a traceback."""

from __future__ import annotations

import asyncio

from darkroom.config import ConfigError, Settings
from darkroom.db.connection import database_url
from darkroom.db.migrations import migrate
from darkroom.errors import StorageError
from darkroom.storage import ObjectStore, open_store


def open_checked_store(settings: Settings) -> ObjectStore:
    try:
        store = open_store(settings.resolved_storage_url)
        store.check()
    except StorageError as exc:  # including StorageConfigError and StorageUnavailable
        raise ConfigError(f"DARKROOM_STORAGE_URL: {exc}") from None
    return store


async def prepare(settings: Settings) -> tuple[str, ObjectStore]:
    """The database's conninfo (migrated; safe in parallel) and the checked store."""
    conninfo = database_url(settings)
    await asyncio.to_thread(migrate, conninfo)
    store = await asyncio.to_thread(open_checked_store, settings)
    return conninfo, store
