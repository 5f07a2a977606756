"""A compromised decoder, through a real worker, PostgreSQL and the S3 store, lying about
what went wrong: the card gets the worker's verdict, never the child's story."""

from __future__ import annotations

import json

import pytest

from tests.support.services import CORPUS, Harness, wait_for

PHOTO = (CORPUS / "Dune.jpg").read_bytes()


@pytest.mark.parametrize("child", [
    ("rogue", "detail-list"),  # an answer the parent could not parse: the attempt crashed
    ("rogue", "blame", "storage_unavailable"),  # retried as the store's fault
    ("rogue", "blame", "original_missing"),  # the owner told the upload is gone
])
def test_a_lying_decoder_fails_its_own_card_as_processing_failed(
        harness: Harness, child: tuple[str, ...]) -> None:
    ids = [harness.upload(PHOTO, owner="mallory") for _ in range(2)]
    w = harness.worker(concurrency=1, child=child)
    wait_for(lambda: harness.all_finished(ids), timeout=120, what="the cards finished")
    assert harness.statuses(ids) == {"rejected": 2}
    assert {harness.card(i)["error_code"] for i in ids} == {"processing_failed"}
    assert {harness.card(i)["attempts"] for i in ids} == {1}  # no retry, no reclaim
    assert w.proc.poll() is None
    entries = [json.loads(line) for line in w.log().splitlines() if line.startswith("{")]
    assert not [e for e in entries if e["msg"] == "attempt crashed"]
    failed = [e for e in entries if e["msg"] == "attempt failed"]
    assert [e["error_code"] for e in failed] == ["processing_failed"] * 2
