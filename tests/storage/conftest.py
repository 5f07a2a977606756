from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from darkroom.storage import LocalStore, ObjectStore, S3Store, make_client
from tests.support.seaweed import SeaweedServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


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


@pytest.fixture(scope="session")
def s3_client(seaweed: SeaweedServer) -> S3Client:
    """One client for the store contract tests: a new one loads the S3 service model. It
    is `make_client`'s, as `open_store` builds it (test_s3.py builds one from the
    environment)."""
    return make_client(endpoint_url=seaweed.endpoint_url, access_key=seaweed.access_key,
                       secret_key=seaweed.secret_key, region=seaweed.region)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    bucket_name: str = request.getfixturevalue("shared_bucket")
    client: S3Client = request.getfixturevalue("s3_client")
    return S3Store(bucket_name, f"{uuid.uuid4().hex}/darkroom/test", client=client)
