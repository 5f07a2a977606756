"""The recipe of a derivative: every setting that shapes its bytes, and their fingerprint.

Kept apart from the pipeline (`derive.py`) so that the queue, which stores the fingerprint
with each derivative it publishes, and `darkroom rederive`, which compares it, know the
recipe without importing the image pipeline.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from darkroom.config import Settings

WEBP_QUALITY = 80
WEBP_EFFORT = 4

# Bump when the pipeline itself changes what it writes (colour handling, metadata, ...),
# so that `darkroom rederive --all` takes every derivative made before the change.
PIPELINE_VERSION = 1


def settings_fingerprint(settings: Settings) -> str:
    """A short digest of everything that shapes a derivative's bytes, stored with each
    derivative so that `darkroom rederive` finds those made with other settings.

    Input limits (bytes, pixels) are left out: they decide whether a file is derived at
    all, not what its derivative looks like.
    """
    shape = {"pipeline": PIPELINE_VERSION, "max_edge": settings.derivative_max_edge,
             "format": "webp", "quality": WEBP_QUALITY, "effort": WEBP_EFFORT}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
    return digest[:16]
