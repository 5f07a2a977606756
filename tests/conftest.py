from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from darkroom.db.connection import open_pool
from tests.support.postgres import TestPostgres
from tests.support.seaweed import SeaweedServer
from tests.support.services import CORPUS, make_queue  # noqa: F401 - for fixtures


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPostgres]:
    server = TestPostgres.start(tmp_path_factory.mktemp("pg"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def db_url(postgres: TestPostgres) -> Iterator[str]:
    with postgres.database() as url:
        yield url


@pytest.fixture
def empty_db_url(postgres: TestPostgres) -> Iterator[str]:
    with postgres.database(migrated=False) as url:
        yield url



@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[Any]:
    p = await open_pool(db_url, min_size=1, max_size=4)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One real S3 server (SeaweedFS) for the whole run; each test takes its own bucket."""
    server = SeaweedServer.start(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        server.stop()
