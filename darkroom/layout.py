"""Where a card's bytes live in the object store: the one definition of the key layout.

    originals/{file_id}                  every uploaded version of the original
    derived/{file_id}/{token}.webp       one attempt's derivative (the token makes the key
                                         unique to the attempt, so attempts never share
                                         bytes and a card's key names the attempt that
                                         published it): the preview, ≤ 2048 px
    derived/{file_id}/{token}.thumb.webp the same attempt's thumb, ≤ 400 px
    _darkroom/canary/{uuid}              the store breaker's probe object: written, read
                                         back and deleted by a worker; no card's, never
                                         listed by the sweeper or reconcile
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Literal, Protocol

ORIGINALS = "originals/"
DERIVED = "derived/"
# Reserved for darkroom's own use, outside every card's prefix: reconcile lists only
# ORIGINALS and DERIVED, so a canary left by a probe cut short is never taken for a card's.
CANARY = "_darkroom/canary/"

_ORIGINAL = re.compile(r"originals/([0-9a-f-]{36})")
_DERIVED = re.compile(r"derived/([0-9a-f-]{36})/([0-9a-f-]{36})(\.thumb)?\.webp")


class _Attempt(Protocol):
    @property
    def file_id(self) -> uuid.UUID: ...
    @property
    def token(self) -> uuid.UUID: ...


def original_key(file_id: uuid.UUID) -> str:
    return f"{ORIGINALS}{file_id}"


def derived_key(lease: _Attempt) -> str:
    """Unique to the attempt: two attempts never write the same bytes' key."""
    return f"{DERIVED}{lease.file_id}/{lease.token}.webp"


def thumb_key(lease: _Attempt) -> str:
    """The same attempt's thumb, under the card's derived prefix (a purge lists it too)."""
    return f"{DERIVED}{lease.file_id}/{lease.token}.thumb.webp"


def canary_key(probe: uuid.UUID) -> str:
    """One probe's object: unique, so probes of several workers never share a key."""
    return f"{CANARY}{probe}"


def derived_prefix(file_id: uuid.UUID) -> str:
    """Every attempt's derivative of one card."""
    return f"{DERIVED}{file_id}/"


@dataclass(frozen=True, slots=True)
class ParsedKey:
    kind: Literal["original", "derived", "thumb"]
    file_id: uuid.UUID
    token: uuid.UUID | None


def parse_key(key: str) -> ParsedKey | None:
    """What a key names, or None for a key outside the layout."""
    try:
        if m := _ORIGINAL.fullmatch(key):
            return ParsedKey("original", uuid.UUID(m.group(1)), None)
        if m := _DERIVED.fullmatch(key):
            kind: Literal["derived", "thumb"] = "thumb" if m.group(3) else "derived"
            return ParsedKey(kind, uuid.UUID(m.group(1)), uuid.UUID(m.group(2)))
    except ValueError:
        return None
    return None
