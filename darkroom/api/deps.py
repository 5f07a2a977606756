"""What the routes take from the app, as `Annotated` aliases, each defined once here.

The app's lifespan builds the objects (`app.state`); a route names what it needs in its
signature and never reaches into the state itself. (Keys, `Caller` and `Admin`, are
`auth.py`'s.)
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import Depends, Path, Request

from darkroom.api.auth import Caller
from darkroom.api.problems import not_found
from darkroom.config import Settings
from darkroom.db.database import Database
from darkroom.files import Files
from darkroom.keys import key_name
from darkroom.queue import Queue
from darkroom.reads import Reads
from darkroom.storage import ObjectStore


def _queue(request: Request) -> Queue:
    queue: Queue = request.app.state.queue
    return queue


def _reads(request: Request) -> Reads:
    reads: Reads = request.app.state.reads
    return reads


def _db(request: Request) -> Database:
    db: Database = request.app.state.db
    return db


def _store(request: Request) -> ObjectStore:
    store: ObjectStore = request.app.state.store
    return store


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _files(request: Request) -> Files:
    files: Files = request.app.state.files
    return files


def _actor(request: Request, who: Caller) -> str:
    """Who asked, for the card's history: the key by its listed prefix, and its owner."""
    _, _, key = request.headers.get("authorization", "").partition(" ")
    return f"api:{key_name(key.strip())} owner={who.owner}"


QueueDep = Annotated[Queue, Depends(_queue)]
ReadsDep = Annotated[Reads, Depends(_reads)]
DbDep = Annotated[Database, Depends(_db)]
StoreDep = Annotated[ObjectStore, Depends(_store)]
SettingsDep = Annotated[Settings, Depends(_settings)]
FilesDep = Annotated[Files, Depends(_files)]
# Names the caller in a card's history (after `Caller`/`Admin` have let it in).
Actor = Annotated[str, Depends(_actor)]

# Declared a UUID in the schema, taken as any string: a malformed id is answered like an
# id that does not exist (404), not as a validation error. Parsed in the route
# (`file_uuid`), after the key is checked and the body validated.
FileId = Annotated[
    str, Path(description="The card's id (a UUID).", json_schema_extra={"format": "uuid"})
]


def file_uuid(raw: str) -> uuid.UUID:
    """A path's card id; a malformed one is just an id that does not exist: 404."""
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise not_found() from None
