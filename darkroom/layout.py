"""Where a card's bytes live in the object store: the one definition of the key layout.

    originals/o-{owner}/{file_id}        every uploaded version of the original; {owner}
                                         is the owner escaped (below), so a stored original
                                         names its owner even when its card is lost
    originals/{file_id}                  the same, as written before owners were in the key
                                         (and for an owner too long to escape into one
                                         segment): still read, listed and purged alike,
                                         since every path but reconcile takes the key a
                                         card stores, never a recomputed one
    derived/{file_id}/{token}.webp       one attempt's derivative (the token makes the key
                                         unique to the attempt, so attempts never share
                                         bytes and a card's key names the attempt that
                                         published it): the preview, ≤ 2048 px
    derived/{file_id}/{token}.thumb.webp the same attempt's thumb, ≤ 400 px
    _darkroom/canary/{uuid}              the store breaker's probe object: written, read
                                         back and deleted by a worker; no card's, never
                                         listed by the sweeper or reconcile

The owner segment is "o-" and then the owner's UTF-8 bytes, each of A-Z a-z 0-9 . - as
itself and any other as "_" and two lowercase hex digits ("a b/c" is "o-a_20b_2fc"). It
is a valid store segment (never "/", "%", "." or ".."), reversible, readable for the usual
owner, and cannot be taken for the old form: the old form has no segment between
originals/ and the id, and "o" is not a hex digit, so no owner segment is ever a file id.
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

_ORIGINAL = re.compile(r"originals/(?:(o-[A-Za-z0-9._-]+)/)?([0-9a-f-]{36})")
_OWNER_PREFIX = "o-"
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")
_ESCAPE = re.compile(r"_([0-9a-f]{2})")
# A store key segment is at most 200 characters (storage.base); an owner whose escaped form
# does not fit gets the old form, and a restore takes its owner from --owner as before.
_MAX_SEGMENT = 200
_DERIVED = re.compile(r"derived/([0-9a-f-]{36})/([0-9a-f-]{36})(\.thumb)?\.webp")


class _Attempt(Protocol):
    @property
    def file_id(self) -> uuid.UUID: ...
    @property
    def token(self) -> uuid.UUID: ...


def owner_segment(owner: str) -> str | None:
    """The key segment naming `owner`, or None when its escaped form is too long."""
    segment = _OWNER_PREFIX + "".join(
        chr(b) if b in _PLAIN else f"_{b:02x}" for b in owner.encode("utf-8"))
    return segment if len(owner) and len(segment) <= _MAX_SEGMENT else None


def segment_owner(segment: str) -> str | None:
    """The owner a segment names, or None when it is not one `owner_segment` makes (so
    one owner has exactly one segment)."""
    if not segment.startswith(_OWNER_PREFIX):
        return None
    raw = bytearray()
    body = segment[len(_OWNER_PREFIX):]
    at = 0
    while at < len(body):
        if body[at] == "_":
            m = _ESCAPE.match(body, at)
            if m is None:
                return None
            raw.append(int(m.group(1), 16))
            at = m.end()
        else:
            raw.extend(body[at].encode("ascii", "replace"))
            at += 1
    try:
        owner = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return owner if owner_segment(owner) == segment else None


def original_key(file_id: uuid.UUID, owner: str | None) -> str:
    """A new card's original: under its owner's segment. None (or an owner too long for
    one segment) gives the old form, `originals/{file_id}`. Everything that reads, lists
    or deletes an existing card's original uses the key its card stores instead."""
    segment = owner_segment(owner) if owner is not None else None
    if segment is None:
        return f"{ORIGINALS}{file_id}"
    return f"{ORIGINALS}{segment}/{file_id}"


# An attempt's objects, as templates of its card's id and its token: the preview, then the
# thumb. An attempt whose lease ends unpublished is recorded by the database
# (unpublished_attempts, migration 0020), and the sweeper fills these templates in for it
# (sweeper.sql `sweep_unpublished_attempts`), so this is their one definition for the
# database too.
ATTEMPT_KEYS = (DERIVED + "{file}/{token}.webp", DERIVED + "{file}/{token}.thumb.webp")


def derived_key(lease: _Attempt) -> str:
    """Unique to the attempt: two attempts never write the same bytes' key."""
    return ATTEMPT_KEYS[0].format(file=lease.file_id, token=lease.token)


def thumb_key(lease: _Attempt) -> str:
    """The same attempt's thumb, under the card's derived prefix (a purge lists it too)."""
    return ATTEMPT_KEYS[1].format(file=lease.file_id, token=lease.token)


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
    # An original's owner when its key names one; None for the old form and derivatives.
    owner: str | None = None


def parse_key(key: str) -> ParsedKey | None:
    """What a key names, or None for a key outside the layout."""
    try:
        if m := _ORIGINAL.fullmatch(key):
            owner = segment_owner(m.group(1)) if m.group(1) else None
            if m.group(1) and owner is None:
                return None
            return ParsedKey("original", uuid.UUID(m.group(2)), None, owner)
        if m := _DERIVED.fullmatch(key):
            kind: Literal["derived", "thumb"] = "thumb" if m.group(3) else "derived"
            return ParsedKey(kind, uuid.UUID(m.group(1)), uuid.UUID(m.group(2)))
    except ValueError:
        return None
    return None
