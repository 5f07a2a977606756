"""The originals key layout: the owner segment is reversible, a valid store segment, and
never taken for the old form."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from darkroom.keys import MAX_OWNER_LENGTH
from darkroom.layout import ORIGINALS, original_key, owner_segment, parse_key, segment_owner
from darkroom.storage.base import validate_key

# What keys.validate_owner admits: 1..MAX_OWNER_LENGTH characters, no control characters.
owners = st.text(st.characters(blacklist_categories=("Cc", "Cs")),
                 min_size=1, max_size=MAX_OWNER_LENGTH)


@given(owners, st.uuids())
def test_an_original_key_names_its_owner_or_falls_back_to_the_old_form(
        owner: str, file_id: uuid.UUID) -> None:
    key = original_key(file_id, owner)
    assert validate_key(key) == key  # a valid key for every store: no "%", "..", "/"
    parsed = parse_key(key)
    assert parsed is not None and parsed.kind == "original" and parsed.file_id == file_id
    if owner_segment(owner) is None:  # too long to escape into one segment
        assert key == original_key(file_id, None) and parsed.owner is None
    else:
        assert parsed.owner == owner
        assert key.count("/") == 2


@given(st.uuids())
def test_the_old_form_still_parses_and_names_no_owner(file_id: uuid.UUID) -> None:
    key = original_key(file_id, None)
    assert key == f"{ORIGINALS}{file_id}"
    parsed = parse_key(key)
    assert parsed is not None and (parsed.file_id, parsed.owner) == (file_id, None)


def test_the_owner_segment_is_readable_and_canonical() -> None:
    file_id = uuid.UUID(int=7)
    assert original_key(file_id, "alice") == f"originals/o-alice/{file_id}"
    assert original_key(file_id, "a b/c") == f"originals/o-a_20b_2fc/{file_id}"
    assert original_key(file_id, "..") == f"originals/o-../{file_id}"
    # An owner that looks like a file id is still a segment, never the old form's id.
    assert parse_key(original_key(file_id, str(file_id))).owner == str(file_id)  # type: ignore[union-attr]
    # One owner, one segment: other spellings of the same bytes are not in the layout.
    for other in ("o-_61lice", "o-", "o-_4", "o-_ff", "alice"):
        assert segment_owner(other) is None
        assert parse_key(f"originals/{other}/{file_id}") is None
