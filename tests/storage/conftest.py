from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from darkroom.storage import LocalStore, ObjectStore, S3Store
from tests.support.seaweed import SeaweedServer


def fresh_bucket_name() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def bucket(seaweed: SeaweedServer) -> str:
    """A new, versioned bucket for one test."""
    return seaweed.create_bucket(fresh_bucket_name())


@pytest.fixture
def s3_env(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The server's AWS_* variables in this process, as darkroom would find them."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return seaweed.env()


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    request.getfixturevalue("s3_env")
    bucket_name: str = request.getfixturevalue("bucket")
    # Built from the environment, the way `open_store` builds it in production.
    return S3Store(bucket_name, "darkroom/test")
