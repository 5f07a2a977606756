from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from hypothesis import settings

from darkroom.db.connection import open_pool
from tests.support.postgres import TestPostgres
from tests.support.seaweed import SeaweedServer
from tests.support.services import CORPUS, make_queue  # noqa: F401 - for fixtures

# `make test-fast` runs with --hypothesis-profile=fast: every property test still runs, on
# fewer examples (tests/support/services.py `examples`); `make test` explores in full.
settings.register_profile("fast", max_examples=10)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPostgres]:
    server = TestPostgres.start(tmp_path_factory.mktemp("pg"))
    server.skip_flushes()
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


@pytest.fixture(scope="session")
def shared_bucket(seaweed: SeaweedServer) -> str:
    """One versioned bucket for the tests whose store needs only a prefix of its own: a
    store sees nothing outside its prefix (tests/storage/test_s3.py checks that), and a
    new bucket costs a volume allocation on its first write. A test that looks at a whole
    bucket takes its own (`seaweed.create_bucket`)."""
    return seaweed.create_bucket(f"shared-{uuid.uuid4().hex[:12]}")
