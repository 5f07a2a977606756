from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from darkroom.storage import open_store
from tests.support.services import Harness


@pytest.fixture
def harness(db_url: str, seaweed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[Harness]:
    """A fresh database and bucket, shared by this test's worker processes."""
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    bucket = seaweed.create_bucket(f"t-{uuid.uuid4().hex[:12]}")
    url = f"s3://{bucket}/darkroom"
    h = Harness(db_url, open_store(url), url, tmp_path, extra_env=seaweed.env())
    try:
        yield h
    finally:
        h.close()
