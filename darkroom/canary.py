"""The store breaker's probe: a small object written, read back and deleted.

A store's front (an S3 gateway) can answer metadata requests while its data servers are
down, stalled or throttling; only a round trip through the data path proves the store can
serve a file. The object lives under the reserved `layout.CANARY` prefix, which no card
uses and neither the sweeper nor reconcile lists.
"""

from __future__ import annotations

import uuid

from darkroom.errors import StorageUnavailable
from darkroom.layout import canary_key
from darkroom.storage import ObjectStore


def round_trip(store: ObjectStore) -> None:
    """Put, get and delete one canary object, or raise the store's error."""
    probe = uuid.uuid4()
    key = canary_key(probe)
    body = b"darkroom canary " + probe.bytes
    version = store.put(key, body, content_type="application/octet-stream")
    try:
        if store.get(key, version) != body:
            raise StorageUnavailable("the object store answered other bytes")
    finally:
        store.delete(key, version)
