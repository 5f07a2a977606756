"""What hashing at confirm costs: confirm of cards created with and without a `sha256`.

    .venv/bin/python -m bench.confirm_digest [--n 40]

A card created with a claimed sha256 is confirmed only after the API has hashed the
stored bytes (darkroom/files.py: `Files._confirm_digest`); a card without one takes the
path it always took (a HEAD and one statement). This measures both, interleaved in one
run (plain, digest, plain, digest, ...) so the machine's noise falls on both alike, for a
tiny original and a corpus photo, on the local store and on SeaweedFS (S3; the presigned
upload carries no checksum, so the API streams the object back to hash it).

One sequential client (closed loop) against a real `darkroom api` process, a private
PostgreSQL (pgserver) and each store; cards are staged before the clock starts. Writes
bench/out/confirm_digest.json (bench/results.py `ConfirmDigestResult`: per store and
size, the median and p90 in ms of each variant and the ratio of the medians) and prints
it through its renderer (bench/sections.py `confirm_digest_section`). With
`--baseline-pythonpath`, also the plain confirm of this code against another copy of
darkroom (two API processes on one database, requests alternating), to show that cards
without a digest did not get slower.

    rm -rf /tmp/darkroom-base && mkdir /tmp/darkroom-base
    git archive 9fcc8ad darkroom | tar -x -C /tmp/darkroom-base
    .venv/bin/python -m bench.confirm_digest --n 30 --baseline-pythonpath /tmp/darkroom-base
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from bench.api import System, stop, tiny_jpeg
from bench.cpu import machine
from bench.results import (
    ConfirmBaseline,
    ConfirmDigestCase,
    ConfirmDigestResult,
    ConfirmDigestStore,
    ConfirmTiming,
    save,
)
from bench.runs import OUT, command
from bench.sections import confirm_digest_section
from bench.stats import percentile
from darkroom.db.connection import open_pool
from darkroom.db.database import Database
from darkroom.keys import create_key_at
from darkroom.queue import Queue
from darkroom.storage import open_store
from tests.support.seaweed import SeaweedServer
from tests.support.services import CORPUS, free_port

OWNER = "bench"


async def stage(db_url: str, storage_url: str, data: bytes, n: int
                ) -> list[tuple[str, str, str]]:
    """n pairs of pending cards with stored originals: (variant, id, version), interleaved."""
    store = open_store(storage_url)
    digest = hashlib.sha256(data).hexdigest()
    pool = await open_pool(db_url, min_size=1, max_size=2)
    staged: list[tuple[str, str, str]] = []
    try:
        queue = Queue(Database(pool), lease_seconds=60, max_attempts=3, retry_base_seconds=1,
                      retry_cap_seconds=1)
        for _ in range(n):
            for variant in ("plain", "digest"):
                row = await queue.create_file_keyed(
                    owner=OWNER, filename="b.jpg", content_type="image/jpeg", size=len(data),
                    sha256=digest if variant == "digest" else None)
                assert row is not None
                version = await asyncio.to_thread(store.put, row.original_key, data,
                                                  content_type="image/jpeg")
                staged.append((variant, str(row.id), version))
    finally:
        await pool.close()
    return staged


def timing(values: list[float], p90: bool = True) -> ConfirmTiming:
    values = sorted(values)
    return ConfirmTiming(round(statistics.median(values), 2),
                         round(percentile(values, 0.9), 2) if p90 else None)


def measure(base_url: str, key: str, staged: list[tuple[str, str, str]],
            size: int) -> ConfirmDigestCase:
    times: dict[str, list[float]] = {"plain": [], "digest": []}
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"},
                      timeout=60) as client:
        for variant, file_id, version in staged:
            start = time.perf_counter()
            r = client.post(f"/v1/files/{file_id}/confirm", json={"version": version})
            elapsed = (time.perf_counter() - start) * 1000
            assert r.status_code == 202, r.text
            times[variant].append(elapsed)
    plain, digest = timing(times["plain"]), timing(times["digest"])
    return ConfirmDigestCase(size, plain, digest,
                             round(digest.median_ms / plain.median_ms, 2))


def start_baseline(system: System, pythonpath: str) -> tuple[Any, str]:
    """A second API process running another copy of darkroom (same database and store)."""
    port = free_port()
    env = {**system.api_env, "PYTHONPATH": pythonpath}
    proc = system._spawn(["api", "--host", "127.0.0.1", "--port", str(port)], "api-base", env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the baseline API did not start")
        time.sleep(0.1)


def compare_plain(urls: dict[str, str], key: str, staged: list[tuple[str, str, str]]
                  ) -> ConfirmBaseline:
    """Plain confirms (no digest) sent alternately to this code and the baseline's."""
    plain = [s for s in staged if s[0] == "plain"]
    times: dict[str, list[float]] = {name: [] for name in urls}
    clients = {name: httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                  timeout=60) for name, url in urls.items()}
    try:
        names = list(urls)
        for i, (_, file_id, version) in enumerate(plain):
            name = names[i % len(names)]
            start = time.perf_counter()
            r = clients[name].post(f"/v1/files/{file_id}/confirm", json={"version": version})
            times[name].append((time.perf_counter() - start) * 1000)
            assert r.status_code == 202, r.text
    finally:
        for client in clients.values():
            client.close()
    this, baseline = timing(times["this"], p90=False), timing(times["baseline"], p90=False)
    return ConfirmBaseline(this, baseline, round(this.median_ms / baseline.median_ms, 2))


def run_store(kind: str, n: int, sizes: dict[str, bytes], baseline: str | None = None
              ) -> ConfirmDigestStore:
    tmp = Path(tempfile.mkdtemp(prefix="darkroom-bench-digest-"))
    system = System(tmp, None)
    weed = None
    try:
        if kind == "s3":
            weed = SeaweedServer.start(tmp / "s3")
            bucket = weed.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
            system.storage_url = f"s3://{bucket}/b"
            for env in (system.env, system.api_env):
                env.update(weed.env())
                env["DARKROOM_STORAGE_URL"] = system.storage_url
            os.environ.update(weed.env())
        api = system.start_api()
        try:
            key = asyncio.run(create_key_at(system.db_url, OWNER, False))
            results = ConfirmDigestStore({})
            for label, data in sizes.items():
                staged = asyncio.run(stage(system.db_url, system.storage_url, data, n))
                # The first four warm the connection and caches.
                measure(system.base_url, key, staged[:4], len(data))
                results.sizes[label] = measure(system.base_url, key, staged[4:], len(data))
            if baseline is not None:
                base_proc, base_url = start_baseline(system, baseline)
                try:
                    staged = asyncio.run(stage(system.db_url, system.storage_url,
                                               sizes["tiny"], 2 * n))
                    urls = {"this": system.base_url, "baseline": base_url}
                    compare_plain(urls, key, staged[:8])  # warm both
                    results.plain_vs_baseline = compare_plain(urls, key, staged[8:])
                finally:
                    stop(base_proc)
            return results
        finally:
            stop(api)
    finally:
        if weed is not None:
            weed.stop()
        system.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="confirms per variant and size")
    parser.add_argument("--out", type=Path, default=OUT / "confirm_digest.json")
    parser.add_argument("--baseline-pythonpath", default=None,
                        help="a directory holding another darkroom/ (e.g. `git archive` of"
                             " the commit before): its plain confirm is timed against ours")
    args = parser.parse_args()
    photo = CORPUS / "Dune.jpg"
    sizes = {"tiny": tiny_jpeg(), "photo": photo.read_bytes()}
    result = ConfirmDigestResult(
        machine=machine(), n=args.n,
        command=command("confirm_digest"),
        stores={kind: run_store(kind, args.n, sizes, args.baseline_pythonpath)
                for kind in ("local", "s3")})
    save(result, args.out)
    print("\n".join(confirm_digest_section(result)))
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
