"""The chaos run's system under fire: the real pieces as processes, the seeded fault
schedule, and the checks from the database and the bucket. `tests/chaos/test_chaos.py`
runs it reduced; `bench/chaos.py` runs it full size and writes docs/RELIABILITY.md.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import random
import signal
import struct
import threading
import time
import traceback
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from darkroom.layout import CANARY, DERIVED
from darkroom.storage import S3Store
from tests.support.faults import FaultProxy, through_proxy
from tests.support.postgres import TestPostgres
from tests.support.seaweed import SeaweedServer
from tests.support.services import (
    DarkroomProcess,
    corpus_photos,
    free_port,
    wait_for,
    wait_past_guard,
)
from tests.support.sql import SQL

ROOT = Path(__file__).resolve().parents[2]
LEASE = 2.0
RETRY_BASE = 1.0
MAX_ATTEMPTS = 8
GUARD = 3.0
RETRY_CAP = 8.0
# Each statement of a worker is cut before reaching PostgreSQL, or after it answered, at
# these rates; the store refuses the workers for longer than the whole retry schedule
# (MAX_ATTEMPTS retries at up to RETRY_CAP each, about 40 s at most), in which every
# claimed card would have been rejected without the store breaker.
CUT_RATE = 0.01
STORE_OUTAGE_SECONDS = RETRY_BASE + RETRY_CAP * (MAX_ATTEMPTS - 3) + 1
# The data servers down while the S3 front answers, for the workers and the API alike.
PARTIAL_OUTAGE_SECONDS = 20.0


# --- inputs --------------------------------------------------------------------------


def _png(width: int, height: int, raw: bytes, *, bit_depth: int = 8, colour: int = 0) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body)))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b""))


def hostile_inputs() -> list[tuple[str, bytes, str]]:
    """(name, bytes, the code it must end with)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (300, 200), (200, 40, 40)).save(buf, "JPEG", quality=90)
    jpeg = buf.getvalue()
    bomb_rows = b"".join(b"\x00" + b"\x00" * 3750 for _ in range(30_000))  # 1-bit rows
    return [
        ("notes.jpg", b"this is plain text, not a picture\n" * 20, "unsupported_format"),
        ("drawing.jpg", b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script>'
                        b"</svg>", "unsupported_format"),
        ("paper.jpg", b"%PDF-1.7\n1 0 obj\n<<>>\nendobj\n" * 10, "unsupported_format"),
        ("truncated.jpg", jpeg[: len(jpeg) // 2], "invalid_image"),
        ("huge-header.png", _png(100_000, 100_000, b"\x00" * 64), "image_too_large"),
        ("bomb.png", _png(30_000, 30_000, bomb_rows, bit_depth=1), "image_too_large"),
    ]


def photos(count: int, rng: random.Random) -> list[bytes]:
    """Corpus photos, shrunk so that a 2-core machine gets through thousands."""
    import pyvips

    sources = corpus_photos()
    out = []
    for i in range(count):
        src = sources[i % len(sources)]
        image = pyvips.Image.thumbnail(str(src), rng.randint(320, 720))
        out.append(image.write_to_buffer(".jpg[Q=85]" if src.suffix == ".jpg" else ".png"))
    return out


# --- the system ----------------------------------------------------------------------


@dataclass
class Tally:
    kills: int = 0
    freezes: int = 0
    pg_restarts: int = 0
    s3_freezes: int = 0
    deletes: int = 0
    double_confirms: int = 0
    s3_stalls: int = 0
    s3_outages: int = 0
    s3_partial_outages: int = 0
    cuts_before: int = 0
    cuts_after: int = 0
    last_fault: float = 0.0
    log: list[str] = field(default_factory=list)
    failure: str | None = None  # the fault schedule's own error, with its traceback

    def note(self, what: str) -> None:
        self.last_fault = time.monotonic()
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}")


class System:
    def __init__(self, tmp: Path, workers: int) -> None:
        self.tmp = tmp
        self.pg = TestPostgres.start(tmp)
        if self.pg.pgdata is None:
            raise SystemExit("the chaos run restarts PostgreSQL: unset DARKROOM_TEST_DATABASE_URL")
        # The volume server (the bytes) in a process of its own, so that the data path can
        # go down while the S3 front answers: the partial outage.
        self.s3 = SeaweedServer.start(tmp / "s3", split_volume=True)
        self.bucket = self.s3.create_bucket(f"chaos-{uuid.uuid4().hex[:8]}")
        self.storage_url = f"s3://{self.bucket}/darkroom"
        self.db_url = self.pg.url_for("postgres")
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
            **self.s3.env(),
            "DARKROOM_DATABASE_URL": self.db_url,
            "DARKROOM_STORAGE_URL": self.storage_url,
            "DARKROOM_DATA_DIR": str(tmp / "data"),
            "DARKROOM_LEASE_SECONDS": str(LEASE),
            "DARKROOM_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "DARKROOM_RETRY_BASE_SECONDS": str(RETRY_BASE),
            "DARKROOM_RETRY_CAP_SECONDS": str(RETRY_CAP),
            "DARKROOM_POLL_SECONDS": "1",
            "DARKROOM_SWEEP_GUARD_SECONDS": str(GUARD),
            "DARKROOM_SWEEP_INTERVAL_SECONDS": "2",
            "DARKROOM_SHUTDOWN_GRACE_SECONDS": "5",
        }
        self.n = 0
        self.db_proxy, db_via_proxy = through_proxy(self.db_url, seed=7)
        host, port = self.s3.endpoint_url.removeprefix("http://").split(":")
        self.s3_proxy = FaultProxy((host, int(port)))
        self.worker_env = {**self.env, "DARKROOM_DATABASE_URL": db_via_proxy,
                           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_proxy.port}"}
        self.api = self.start("api", "--port", str(self.port))
        self.sweeper = self.start("sweep")
        self.workers = [self.start_worker() for _ in range(workers)]
        wait_for(self.api_ready, timeout=60, what="the API")
        self.key = self.create_key()

    def start(self, *args: str, env: dict[str, str] | None = None) -> DarkroomProcess:
        self.n += 1
        return DarkroomProcess(list(args), env or self.env,
                               self.tmp / f"{self.n:03d}-{args[0]}.log")

    def start_worker(self) -> DarkroomProcess:
        return self.start("worker", "--concurrency", "1", "--name", f"chaos-{self.n + 1}",
                          env=self.worker_env)

    def api_ready(self) -> bool:
        try:
            return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def create_key(self) -> str:
        import subprocess
        import sys

        out = subprocess.run([sys.executable, "-m", "darkroom.cli", "keys", "create",
                              "--owner", "chaos"], env=self.env, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()

    def stop(self) -> None:
        for proc in [self.api, self.sweeper, *self.workers]:
            proc.stop()
        self.db_proxy.close()
        self.s3_proxy.close()
        self.s3.stop()
        self.pg.stop()




# --- the client ----------------------------------------------------------------------


class Expired(Exception):
    """The store refused a presigned URL as expired."""


class Client:
    """Uploads through the public API, retrying what an outage interrupts."""

    def __init__(self, system: System) -> None:
        self.base = system.api_url
        self.http = httpx.Client(timeout=10, headers={"Authorization": f"Bearer {system.key}"})

    def retry(self, call: Callable[[], httpx.Response], ok: tuple[int, ...]) -> httpx.Response:
        delay = 0.2
        for _ in range(60):
            try:
                response = call()
                if response.status_code in ok:
                    return response
                if response.status_code == 403 and b"Request has expired" in response.content:
                    raise Expired
                if response.status_code < 500:
                    raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
            except httpx.TransportError:
                pass
            time.sleep(delay)
            delay = min(delay * 1.5, 3.0)
        raise RuntimeError("gave up after an outage longer than the client's patience")

    def upload(self, name: str, data: bytes) -> tuple[uuid.UUID, str]:
        content_type = "image/png" if name.endswith(".png") else "image/jpeg"
        for _ in range(10):
            card = self.retry(lambda: self.http.post(f"{self.base}/v1/files", json={
                "filename": name, "content_type": content_type, "size": len(data)}),
                (201,)).json()
            upload = card["upload"]
            url = upload["url"] if upload["url"].startswith("http") else self.base + upload["url"]
            headers = upload.get("headers") or {}
            if not upload["url"].startswith("http"):
                headers = {**headers, **self.http.headers}
            try:
                put = self.retry(functools.partial(httpx.request, upload["method"], url,
                                                   content=data, headers=headers, timeout=10),
                                 (200,))
            except Expired:
                # The presigned PUT lives as long as the sweeper's guard (3 s here): one
                # held up by a store fault starts over, as a client would; the card left
                # pending without bytes is the pending sweep's.
                continue
            version = put.headers.get("x-amz-version-id") or put.json()["version"]
            return uuid.UUID(card["id"]), version
        raise RuntimeError("every presigned upload expired")

    def confirm(self, file_id: uuid.UUID, version: str) -> None:
        self.retry(lambda: self.http.post(f"{self.base}/v1/files/{file_id}/confirm",
                                          json={"version": version}), (202,))

    def delete(self, file_id: uuid.UUID) -> None:
        self.retry(lambda: self.http.delete(f"{self.base}/v1/files/{file_id}"), (202, 404))


# --- the run -------------------------------------------------------------------------


@dataclass
class Outcome:
    files: int
    hostile: int
    deleted: int
    tally: Tally
    drain_seconds: float
    total_seconds: float
    lease_lost: int
    retries: dict[str, int]
    deferred: int
    orphans_swept: int
    claims: int
    max_starts: int
    statuses: dict[str, int]
    problems: list[str]
    # Derivative writes the store landed after their attempt gave up on them and after
    # the sweeper's guard (3 s here; SeaweedFS's gateway holds a PUT up to 30 s while its
    # volume server is down), so reconcile removed them: nothing else may be left.
    late_writes: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["tally"] = {k: v for k, v in vars(self.tally).items() if k != "last_fault"}
        return d


def faults(system: System, tally: Tally, rng: random.Random, stop: threading.Event,
           progress: Callable[[], float]) -> None:
    """The seeded schedule (`_schedule`). A schedule that fails is the run's failure, with
    its traceback, as soon as the uploads are in, never a drain that waits for ever on a
    fault left in place."""
    try:
        _schedule(system, tally, rng, stop, progress)
    except Exception:
        tally.failure = traceback.format_exc()
        tally.note("the fault schedule failed")


def _schedule(system: System, tally: Tally, rng: random.Random, stop: threading.Event,
              progress: Callable[[], float]) -> None:
    """Each one-off fault fires once progress passes its mark."""
    marks = {"freeze": 0.15, "pg": 0.35, "s3-partial": 0.45, "s3": 0.55, "s3-stall": 0.65,
             "s3-outage": 0.75}
    system.db_proxy.set_cuts(before=CUT_RATE, after=CUT_RATE)
    next_kill = time.monotonic() + rng.uniform(2, 5)
    # However the run goes, faults stop after this long, so a stalled run shows up as a
    # drain that never finishes instead of an endless kill loop.
    give_up = time.monotonic() + 600
    while not stop.wait(0.1) and time.monotonic() < give_up:
        done = progress()
        if time.monotonic() >= next_kill:
            victim = rng.randrange(len(system.workers))
            system.workers[victim].kill9()
            system.workers[victim] = system.start_worker()
            tally.kills += 1
            tally.note(f"kill -9 worker #{victim}")
            next_kill = time.monotonic() + rng.uniform(2, 5)
        if "freeze" in marks and done >= marks["freeze"]:
            del marks["freeze"]
            frozen = system.workers[rng.randrange(len(system.workers))]
            frozen.signal(signal.SIGSTOP)
            tally.note("SIGSTOP a worker")
            stop.wait(LEASE * 2.5)
            frozen.signal(signal.SIGCONT)
            tally.freezes += 1
            tally.note("SIGCONT the frozen worker")
        if "pg" in marks and done >= marks["pg"]:
            del marks["pg"]
            system.pg.restart()
            tally.pg_restarts += 1
            tally.note("PostgreSQL restarted")
        if "s3-partial" in marks and done >= marks["s3-partial"]:
            del marks["s3-partial"]
            # Everyone's store, the API's uploads included: shorter than the client's
            # patience with presigned PUTs that expire under it.
            system.s3.stop_volume()
            tally.note("S3 volume server killed: the front answers, the data path is down")
            stop.wait(PARTIAL_OUTAGE_SECONDS)
            system.s3.start_volume()
            tally.s3_partial_outages += 1
            tally.note("S3 volume server back")
        if "s3" in marks and done >= marks["s3"]:
            del marks["s3"]
            with system.s3.frozen():
                tally.note("S3 frozen")
                stop.wait(RETRY_BASE * 4)
            tally.s3_freezes += 1
            tally.note("S3 thawed")
        if "s3-stall" in marks and done >= marks["s3-stall"]:
            del marks["s3-stall"]
            system.s3_proxy.stall()
            tally.note("S3 stalled for the workers")
            stop.wait(RETRY_BASE * 4)
            system.s3_proxy.heal()
            tally.s3_stalls += 1
            tally.note("S3 stall healed")
        if "s3-outage" in marks and done >= marks["s3-outage"]:
            del marks["s3-outage"]
            system.s3_proxy.refuse()
            tally.note("S3 refuses the workers")
            stop.wait(STORE_OUTAGE_SECONDS)
            system.s3_proxy.heal()
            tally.s3_outages += 1
            tally.note("S3 answers the workers again")
        if not marks and done >= 0.8:
            break
    system.db_proxy.set_cuts()
    tally.cuts_before = system.db_proxy.counters.cut_before
    tally.cuts_after = system.db_proxy.counters.cut_after


def run(files: int, seed: int, tmp: Path, workers: int = 4) -> Outcome:
    rng = random.Random(seed)
    hostile = hostile_inputs()
    n_hostile = max(len(hostile), files // 20)
    inputs: list[tuple[str, bytes, str | None]] = [
        (f"photo-{i}.jpg", data, None) for i, data in enumerate(photos(files - n_hostile, rng))]
    inputs += [hostile[i % len(hostile)] for i in range(n_hostile)]
    rng.shuffle(inputs)
    started = time.monotonic()
    system = System(tmp, workers)
    tally = Tally()
    client = Client(system)
    expected: dict[uuid.UUID, str | None] = {}
    deleted: set[uuid.UUID] = set()
    db = psycopg.connect(system.db_url, autocommit=True, row_factory=dict_row)
    db_lock = threading.Lock()
    last_progress = 0.0

    def progress() -> float:
        """Share of files finished; the last known figure while PostgreSQL restarts."""
        nonlocal db, last_progress
        with db_lock:
            try:
                row = db.execute(SQL["finished_count"]).fetchone()
                last_progress = (row["n"] if row else 0) / files
            except psycopg.OperationalError:
                db.close()
                with contextlib.suppress(psycopg.OperationalError):
                    db = psycopg.connect(system.db_url, autocommit=True, row_factory=dict_row)
        return last_progress

    stop = threading.Event()
    chaos = threading.Thread(target=faults, args=(system, tally, rng, stop, progress))
    try:
        chaos.start()

        def one(item: tuple[str, bytes, str | None]) -> None:
            name, data, code = item
            file_id, version = client.upload(name, data)
            client.confirm(file_id, version)
            expected[file_id] = code
            roll = random.Random(f"{seed}-{file_id}").random()
            if roll < 0.02:
                client.confirm(file_id, version)  # the same confirm again: 202, no change
                tally.double_confirms += 1
            elif roll < 0.04:
                time.sleep(random.Random(str(file_id)).uniform(0, 0.5))
                client.delete(file_id)
                deleted.add(file_id)
                tally.deletes += 1

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, inputs))
        chaos.join()
        if tally.failure is not None:
            raise RuntimeError(f"{tally.log}\n{tally.failure}")
        wait_for(lambda: progress() * files >= files - len(deleted) or None, timeout=1800,
                 interval=0.5, what="the queue to drain")
        drained = time.monotonic()
        stop.set()
        # Past the guard interval, one more sweep takes the last orphans and deletions.
        wait_past_guard(system.db_url, GUARD)
        sweep = system.start("sweep", "--once")
        assert sweep.wait(300) == 0, sweep.log()
        with db_lock:
            db.close()
            db = psycopg.connect(system.db_url, autocommit=True, row_factory=dict_row)
        return verify(system, db, expected, deleted, tally,
                      drain_seconds=drained - max(tally.last_fault, started),
                      total_seconds=time.monotonic() - started, n_hostile=n_hostile)
    finally:
        stop.set()
        chaos.join()
        db.close()
        system.stop()


def verify(system: System, db: psycopg.Connection[Any], expected: dict[uuid.UUID, str | None],
           deleted: set[uuid.UUID], tally: Tally, **figures: Any) -> Outcome:
    problems: list[str] = []
    cards = {r["id"]: r for r in db.execute(SQL["finished_cards"]).fetchall()}
    events = db.execute(SQL["events"], {"id": None, "kind": None}).fetchall()
    statuses = Counter(r["status"] for r in cards.values())
    if statuses.get("processing") or statuses.get("queued") or statuses.get("deleting"):
        problems.append(f"unfinished cards: {dict(statuses)}")
    for file_id, code in expected.items():
        card = cards.get(file_id)
        if file_id in deleted:
            if card is not None:
                problems.append(f"{file_id}: deleted but still has a card")
            continue
        if card is None:
            problems.append(f"{file_id}: card lost")
        elif code is None and card["status"] != "ready":
            problems.append(f"{file_id}: photo ended {card['status']}/{card['error_code']}")
        elif code is not None and (card["status"], card["error_code"]) != ("rejected", code):
            problems.append(f"{file_id}: hostile input ended {card['status']}/"
                            f"{card['error_code']}, expected {code}")
    # Attempts started: claims, less those handed back for the store with the attempt
    # given back (`deferred`, and `deferred_counted` for one the store failed alone).
    claims = Counter(e["file_id"] for e in events if e["kind"] == "claimed")
    claims.subtract(Counter(e["file_id"] for e in events
                            if e["kind"] in ("deferred", "deferred_counted")))
    last_claim = {e["file_id"]: e["token"] for e in events if e["kind"] == "claimed"}
    ready = [e for e in events if e["kind"] == "ready"]
    published = Counter(e["file_id"] for e in ready)
    for e in ready:
        if e["token"] != last_claim.get(e["file_id"]):
            problems.append(f"{e['file_id']}: published by an attempt that was not the last")
    for file_id, n in published.items():
        if n > 1:
            problems.append(f"{file_id}: published {n} times")
    if claims and max(claims.values()) > MAX_ATTEMPTS:
        problems.append(f"a file was started {max(claims.values())} times")
    store = S3Store(system.bucket, "darkroom", client=system.s3.client())
    wanted: set[tuple[str, str]] = set()
    for card in cards.values():
        wanted.add((card["original_key"], card["original_version"]))
        if card["status"] == "ready":
            wanted.add((card["derived_key"], card["derived_version"]))
            if card["thumb_key"]:  # the thumbnail published with it
                wanted.add((card["thumb_key"], card["thumb_version"]))
            data = store.get(card["derived_key"], card["derived_version"])
            if hashlib.sha256(data).hexdigest() != card["sha256"]:
                problems.append(f"{card['id']}: derivative does not match its sha256")
            ready_token = next(e["token"] for e in ready if e["file_id"] == card["id"])
            if str(ready_token) not in card["derived_key"]:
                problems.append(f"{card['id']}: derivative is not the publishing attempt's")
    # The breaker's probe objects are no card's; one cut short may be left behind.
    present = {(o.key, o.version) for o in store.list("") if not o.key.startswith(CANARY)}
    # An upload the client started over (its presigned PUT expired under a store fault)
    # may have stored its bytes: its card is still pending, the pending sweep's.
    pending = {r["original_key"] for r in db.execute(SQL["pending_originals"]).fetchall()}
    left = {(key, version) for key, version in present - wanted if key not in pending}
    attempts = {f"{e['file_id']}/{e['token']}" for e in events if e["kind"] == "claimed"}
    late = {(key, version) for key, version in left if key.startswith(DERIVED)
            and key[len(DERIVED):].split(".", 1)[0] in attempts}
    if late:
        # An unpublished attempt's own object: reconcile's, once past the guard.
        def reconciled() -> bool:
            assert system.start("reconcile").wait(120) == 0
            return not late & {(o.key, o.version) for o in store.list(DERIVED)}

        wait_for(reconciled, timeout=120, interval=1, what="reconcile to remove late writes")
        left -= late
    if left:
        problems.append(f"{len(left)} objects left that no card accounts for: "
                        f"{sorted(key for key, _ in left)[:5]}")
    if wanted - present:
        problems.append(f"{len(wanted - present)} objects missing")
    orphans_left = db.execute(SQL["orphan_count"]).fetchone()
    if orphans_left and orphans_left["n"]:
        problems.append(f"{orphans_left['n']} orphan rows left after the sweep")
    swept = 0
    for log in system.tmp.glob("*-sweep.log"):
        swept += log.read_text(errors="replace").count('"orphan deleted"')
    return Outcome(
        files=len(expected), hostile=figures.pop("n_hostile"), deleted=len(deleted),
        tally=tally, lease_lost=sum(1 for e in events if e["kind"] == "lease_lost"),
        retries=dict(Counter(str(e["error_code"]) for e in events
                             if e["kind"] == "retry_scheduled")),
        deferred=sum(1 for e in events if e["kind"] in ("deferred", "deferred_counted")),
        orphans_swept=swept, late_writes=len(late), claims=sum(claims.values()),
        max_starts=max(claims.values()) if claims else 0,
        statuses=dict(statuses), problems=problems, **figures)
