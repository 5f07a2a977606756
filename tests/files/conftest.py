from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from darkroom.storage import LocalStore, ObjectStore, S3Store, make_client
from tests.support.seaweed import SeaweedServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@pytest.fixture(scope="session")
def flow_s3_client(seaweed: SeaweedServer) -> S3Client:
    """One client for the run: a new one loads the S3 service model."""
    return make_client(endpoint_url=seaweed.endpoint_url, access_key=seaweed.access_key,
                       secret_key=seaweed.secret_key, region=seaweed.region)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """The two stores the flow meets, each a real one: the local store (uploads through
    the API, `head` in the event loop) and S3 (presigned uploads, SeaweedFS)."""
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    bucket: str = request.getfixturevalue("shared_bucket")
    client: S3Client = request.getfixturevalue("flow_s3_client")
    return S3Store(bucket, f"{uuid.uuid4().hex}/darkroom", client=client)
