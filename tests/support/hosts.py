"""The multi-host rehearsal's hosts (network namespaces on a bridge), processes, faults and
checks. `tests/chaos/test_hosts.py` runs it reduced; `bench/hosts.py` runs it full size,
draws its timeline and writes its section of docs/RELIABILITY.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from darkroom.db import embedded
from darkroom.db.connection import SESSION_OPTIONS
from darkroom.db.migrations import migrate
from tests.support.chaos import MAX_ATTEMPTS, Client, Outcome, Tally, hostile_inputs, photos, verify
from tests.support.seaweed import SeaweedServer
from tests.support.services import wait_for, wait_past_guard
from tests.support.sql import SQL

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "dr16"
SUBNET = "10.216.16"
CLIENT = f"{SUBNET}.1"
HOSTS = {"db": 2, "store": 3, "api": 4, "w1": 11, "w2": 12, "w3": 13, "sweep": 20}
WORKERS = ("w1", "w2", "w3")
LEASE = 6.0
RETRY_BASE = 1.0
GUARD = 3.0
PG_PORT, API_PORT = 5432, 8000
NOWHERE = "02:00:00:00:16:16"  # a MAC no interface has: frames to it are dropped
# Longer than any limit darkroom puts on a database connection: a probe that gets no
# answer within it found a hung request.
PROBE_TIMEOUT = 60.0



def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=60)


def addr(host: str) -> str:
    return f"{SUBNET}.{HOSTS[host]}"


class Network:
    """The bridge, one namespace per host, and the faults between them."""

    @staticmethod
    def unavailable() -> str | None:
        """Why this machine cannot run the rehearsal, or None."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "iproute2 (`ip`) is not installed"
        probe = f"{PREFIX}-probe"
        made = sh("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"`ip netns add` is not permitted here: {made.stderr.strip()[:120]}"
        sh("ip", "netns", "del", probe, check=False)
        return None

    def __init__(self) -> None:
        self.bridge = f"{PREFIX}-br"

    def ns(self, host: str) -> str:
        return f"{PREFIX}-{host}"

    def exec(self, host: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def up(self) -> None:
        self.down()  # whatever a killed earlier run left behind
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{CLIENT}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for host, n in HOSTS.items():
            ns, outside = self.ns(host), self.ns(host)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            sh("ip", "link", "set", outside, "master", self.bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{n}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        # Every address this run contacts must be one of these hosts, on this bridge.
        for host in HOSTS:
            route = sh("ip", "route", "get", addr(host)).stdout
            if f"dev {self.bridge}" not in route:
                self.down()
                raise SystemExit(f"hosts: {addr(host)} is not routed to {self.bridge}"
                                 f" ({route.strip()}); another network uses {SUBNET}.0/24")

    def down(self) -> None:
        for host in HOSTS:
            self.kill_host(host)
            sh("ip", "netns", "del", self.ns(host), check=False)
            sh("ip", "link", "del", self.ns(host), check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def link(self, host: str, up: bool) -> None:
        """The host's cable: down, every packet to and from it is lost."""
        sh("ip", "link", "set", self.ns(host), "up" if up else "down")

    def drop(self, host: str, to: str, dropped: bool) -> None:
        """Silently drop what `host` sends to `to` (and so every exchange with it)."""
        if dropped:
            sh("ip", "-n", self.ns(host), "neigh", "replace", addr(to), "lladdr", NOWHERE,
               "dev", "eth0", "nud", "permanent")
        else:
            sh("ip", "-n", self.ns(host), "neigh", "del", addr(to), "dev", "eth0",
               check=False)

    def kill_host(self, host: str) -> int:
        """SIGKILL every process in the host's namespace, as a power cut would."""
        pids = sh("ip", "netns", "pids", self.ns(host), check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        return len(pids)


class HostProcess:
    """One `darkroom …` process on a host, with its own log file."""

    def __init__(self, net: Network, host: str, args: Sequence[str], env: dict[str, str],
                 log_path: Path) -> None:
        self.host, self.log_path = host, log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*net.exec(host), sys.executable, "-m", "darkroom.cli", *args], env=env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


class Postgres:
    """The embedded PostgreSQL, moved onto the db host and listening on its address."""

    def __init__(self, net: Network, base: Path) -> None:
        self.pg_ctl = embedded.binary("pg_ctl")
        self.net, self.pgdata = net, base / "pg"
        # darkroom's embedded start creates the cluster (as its unprivileged user when
        # root), then it is stopped and started again inside the db namespace.
        embedded.start(self.pgdata)
        self._ctl("stop")
        with (self.pgdata / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        self._ctl("start", "-o", f"-c listen_addresses={addr('db')} -p {PG_PORT} "
                  f"-k {self.pgdata}", "-l", str(self.pgdata / "db-host.log"), wrap=True)
        self.url = f"postgresql://postgres@{addr('db')}:{PG_PORT}/postgres"

    def _ctl(self, action: str, *args: str, wrap: bool = False) -> None:
        user = ["setpriv", f"--reuid={embedded.SERVICE_USER}",
                f"--regid={embedded.SERVICE_USER}", "--init-groups"]
        prefix = self.net.exec("db") if wrap else []
        subprocess.run([*prefix, *user, self.pg_ctl, "-D", str(self.pgdata), "-w", "-m",
                        "fast", *args, action], check=True, capture_output=True, timeout=120)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError):
            self._ctl("stop", wrap=True)


@dataclass
class Timeline:
    """Per-second counts from the database, and the faults' spans, for the plot."""

    t0: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)
    spans: list[tuple[str, float, float]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0


class System:
    """What tests.support.chaos.verify reads: `bucket`, `s3`, and `tmp` (logs, `*-sweep.log`)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.net = Network()
        self.net.up()
        base = Path(tempfile.mkdtemp(prefix="darkroom-hosts-pg-"))
        self.pg_base = base
        self.pg = Postgres(self.net, base)
        self.db_url = self.pg.url
        migrate(self.db_url)
        self.s3 = SeaweedServer.start(tmp / "s3", ip=addr("store"), wrap=self.net.exec("store"))
        self.bucket = self.s3.create_bucket(f"hosts-{uuid.uuid4().hex[:8]}")
        self.api_url = f"http://{addr('api')}:{API_PORT}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
            **self.s3.env(),
            "DARKROOM_DATABASE_URL": self.db_url,
            "DARKROOM_STORAGE_URL": f"s3://{self.bucket}/darkroom",
            "DARKROOM_DATA_DIR": str(tmp / "data"),
            "DARKROOM_LEASE_SECONDS": str(LEASE),
            "DARKROOM_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
            "DARKROOM_RETRY_BASE_SECONDS": str(RETRY_BASE),
            "DARKROOM_RETRY_CAP_SECONDS": "8",
            "DARKROOM_POLL_SECONDS": "1",
            "DARKROOM_SWEEP_GUARD_SECONDS": str(GUARD),
            "DARKROOM_SWEEP_INTERVAL_SECONDS": "2",
            "DARKROOM_SHUTDOWN_GRACE_SECONDS": "5",
        }
        self.n = 0
        self.procs: list[HostProcess] = []
        self.api = self.start("api", "api", "--host", addr("api"), "--port", str(API_PORT))
        self.sweeper = self.start("sweep", "sweep")
        self.workers = {w: self.start_worker(w) for w in WORKERS}
        wait_for(self.api_ready, timeout=60, what="the API")
        self.key = self.create_key()

    def start(self, host: str, *args: str) -> HostProcess:
        self.n += 1
        proc = HostProcess(self.net, host, args, self.env,
                           self.tmp / f"{self.n:03d}-{host}-{args[0]}.log")
        self.procs.append(proc)
        return proc

    def start_worker(self, host: str) -> HostProcess:
        return self.start(host, "worker", "--concurrency", "1", "--name", f"{host}-{self.n + 1}")

    def api_ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
        return False

    def create_key(self) -> str:
        out = subprocess.run([*self.net.exec("api"), sys.executable, "-m", "darkroom.cli",
                              "keys", "create", "--owner", "hosts"], env=self.env,
                             capture_output=True, text=True, check=True, timeout=120)
        return out.stdout.strip()

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.s3.stop()
        self.pg.stop()
        self.net.down()
        shutil.rmtree(self.pg_base, ignore_errors=True)


class TimedClient(Client):
    """The chaos run's client, recording how long every API call took."""

    def __init__(self, system: Any) -> None:
        super().__init__(system)
        self.calls: list[tuple[float, float, int]] = []  # (start, seconds, status or 0)
        self.t0 = time.monotonic()
        inner = self.http.request

        def timed(*args: Any, **kwargs: Any) -> httpx.Response:
            start = time.monotonic()
            try:
                response = inner(*args, **kwargs)
            except httpx.TransportError:
                self.calls.append((start - self.t0, time.monotonic() - start, 0))
                raise
            self.calls.append((start - self.t0, time.monotonic() - start,
                               response.status_code))
            return response

        self.http.request = timed  # type: ignore[method-assign]


@dataclass
class HostFaults:
    link_cut_leases_held: int = 0
    # The (card, token) pairs w1 held when its link went down.
    link_cut_leases: list[tuple[uuid.UUID, uuid.UUID]] = field(default_factory=list)
    # When (the database's clock, ISO 8601) the link went down.
    link_cut_at: str | None = None
    link_cut_seconds: float = 0.0
    store_cut_seconds: float = 0.0
    db_cut_seconds: float = 0.0
    readyz_during_db_cut: dict[str, int] = field(default_factory=dict)
    readyz_max_seconds: float = 0.0
    api_calls_during_db_cut: int = 0
    api_slowest_call_during_db_cut: float = 0.0
    probe_statuses: dict[str, int] = field(default_factory=dict)
    accepted_202_after_db_heal_s: float | None = None
    host_kill_processes: int = 0
    reconcile_deleted: int = 0


def probe_image() -> bytes:
    """A small PNG: the uploads that probe the API while its database is cut."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (16, 16), 128).save(buf, "PNG")
    return buf.getvalue()


def probe_ready(system: System, hf: HostFaults) -> None:
    t = time.monotonic()
    try:
        code = str(httpx.get(f"{system.api_url}/readyz", timeout=15).status_code)
    except httpx.HTTPError as exc:
        code = type(exc).__name__
    hf.readyz_max_seconds = max(hf.readyz_max_seconds, time.monotonic() - t)
    hf.readyz_during_db_cut[code] = hf.readyz_during_db_cut.get(code, 0) + 1


def probe_upload(client: TimedClient, hf: HostFaults, probes: list[tuple[uuid.UUID, str]],
                 during_cut: bool) -> int:
    """One small upload (create, PUT, confirm), each call tried once with a timeout
    longer than the database connections' own limits; answers the last status (0: no
    answer at all). During the cut each call is timed on its own: the bound is on a call."""
    data = probe_image()
    status = 0

    def call(method: str, url: str, *, api: bool = True, **kwargs: Any) -> httpx.Response:
        send = client.http.request if api else httpx.request
        t = time.monotonic()
        try:
            return send(method, url, timeout=PROBE_TIMEOUT, **kwargs)
        finally:
            if during_cut:
                hf.api_calls_during_db_cut += 1
                hf.api_slowest_call_during_db_cut = max(hf.api_slowest_call_during_db_cut,
                                                        time.monotonic() - t)

    try:
        made = call("POST", f"{client.base}/v1/files", json={
            "filename": "probe.png", "content_type": "image/png", "size": len(data)})
        status = made.status_code
        if made.status_code == 201:
            card = made.json()
            upload = card["upload"]
            url, put_headers = upload["url"], upload.get("headers") or {}
            if not url.startswith("http"):  # uploads through the API itself
                url, put_headers = client.base + url, {**put_headers, **client.http.headers}
            put = call(upload["method"], url, api=False, content=data, headers=put_headers)
            version = put.headers.get("x-amz-version-id") or put.json()["version"]
            confirmed = call("POST", f"{client.base}/v1/files/{card['id']}/confirm",
                             json={"version": version})
            status = confirmed.status_code
            # A card the cut left pending is confirmed at the end, as a client would.
            probes.append((uuid.UUID(card["id"]), version))
    except httpx.TransportError:
        status = 0
    if during_cut:
        hf.probe_statuses[str(status)] = hf.probe_statuses.get(str(status), 0) + 1
    return status


def faults(system: System, tally: Tally, hf: HostFaults, tl: Timeline, client: TimedClient,
           stop: threading.Event, progress: Any, scale: float,
           probes: list[tuple[uuid.UUID, str]]) -> None:
    net = system.net
    marks = [0.10, 0.30, 0.50, 0.70]

    def wait_mark(mark: float) -> bool:
        while not stop.wait(0.2):
            if progress() >= mark:
                return True
        return False

    db = psycopg.connect(system.db_url, autocommit=True)
    try:
        # 1. w1's cable pulled while it holds leases, for 2.5 leases, then plugged back.
        if not wait_mark(marks[0]):
            return
        def w1_leases() -> list[tuple[uuid.UUID, uuid.UUID]]:
            return [(r[0], r[1]) for r in db.execute(SQL["live_leases_of_worker"],
                                                     {"prefix": "w1-"}).fetchall()]

        try:
            leases = wait_for(w1_leases, timeout=60, interval=0.02, what="w1 to hold a lease")
        except AssertionError:
            leases = []  # the cut goes ahead; the test then fails on link_cut_leases_held
        held = len(leases)
        hf.link_cut_leases_held = held
        hf.link_cut_leases = leases
        start = tl.now()
        net.link("w1", up=False)
        # Read once the link is down: a commit of w1's whose transaction began before
        # this reached the server before the cut (none can begin after it).
        now = db.execute(SQL["db_now"]).fetchone()
        hf.link_cut_at = now[0].isoformat() if now else None
        tally.note(f"w1 link down, holding {held} lease(s)")
        stop.wait(LEASE * 2.5)
        net.link("w1", up=True)
        tally.note("w1 link up")
        hf.link_cut_seconds = tl.now() - start
        tl.spans.append(("w1 link down", start, tl.now()))
        # 2. The store unreachable from w2 only.
        if not wait_mark(marks[1]):
            return
        start = tl.now()
        net.drop("w2", "store", dropped=True)
        tally.note("store unreachable from w2")
        stop.wait(max(4.0, 10.0 * scale))
        net.drop("w2", "store", dropped=False)
        tally.note("store reachable from w2 again")
        hf.store_cut_seconds = tl.now() - start
        tl.spans.append(("store cut from w2", start, tl.now()))
        # 3. The database unreachable from the API: readiness must say so promptly, no
        # request may hang, and uploads must be accepted again by themselves afterwards.
        if not wait_mark(marks[2]):
            return
        start = tl.now()
        net.drop("api", "db", dropped=True)
        tally.note("database unreachable from the API")
        cut_until = time.monotonic() + max(6.0, 12.0 * scale)
        uploader = threading.Thread(target=probe_upload, args=(client, hf, probes, True))
        uploader.start()
        while time.monotonic() < cut_until and not stop.is_set():
            probe_ready(system, hf)
            stop.wait(0.5)
        net.drop("api", "db", dropped=False)
        healed = time.monotonic()
        tally.note("database reachable from the API again")
        hf.db_cut_seconds = tl.now() - start
        tl.spans.append(("db cut from api", start, tl.now()))
        uploader.join()
        while not stop.is_set() and time.monotonic() - healed < 120:
            if probe_upload(client, hf, probes, during_cut=False) == 202:
                hf.accepted_202_after_db_heal_s = time.monotonic() - healed
                break
            stop.wait(0.2)
        # 4. Power cut on w3: every process there dies at once; the host returns later.
        if not wait_mark(marks[3]):
            return
        start = tl.now()
        hf.host_kill_processes = net.kill_host("w3")
        tally.kills += 1
        tally.note(f"w3 host killed ({hf.host_kill_processes} processes)")
        stop.wait(LEASE)
        system.workers["w3"] = system.start_worker("w3")
        tally.note("w3 host back")
        tl.spans.append(("w3 down", start, tl.now()))
    finally:
        db.close()


def sampler(system: System, tl: Timeline, stop: threading.Event) -> None:
    """Once a second: ready, processing, and lease_lost so far, from the database."""
    conn: psycopg.Connection[Any] | None = None
    while not stop.wait(1.0):
        try:
            if conn is None:
                conn = psycopg.connect(system.db_url, autocommit=True, connect_timeout=3)
            row = conn.execute(SQL["progress"]).fetchone()
            if row:
                tl.samples.append((tl.now(), int(row[0]), int(row[1]), int(row[2])))
        except psycopg.Error:
            conn = None
    if conn is not None:
        conn.close()


@dataclass
class HostsOutcome:
    outcome: Outcome
    faults: HostFaults
    timeline: Timeline


def run(files: int, seed: int, tmp: Path) -> HostsOutcome:
    rng = random.Random(seed)
    hostile = hostile_inputs()
    n_hostile = max(len(hostile), files // 20)
    inputs: list[tuple[str, bytes, str | None]] = [
        (f"photo-{i}.jpg", data, None) for i, data in enumerate(photos(files - n_hostile, rng))]
    inputs += [hostile[i % len(hostile)] for i in range(n_hostile)]
    rng.shuffle(inputs)
    started = time.monotonic()
    system = System(tmp)
    tally, hf, tl = Tally(), HostFaults(), Timeline()
    client = TimedClient(system)
    expected: dict[uuid.UUID, str | None] = {}
    deleted: set[uuid.UUID] = set()
    last = 0.0

    def progress() -> float:
        nonlocal last
        if tl.samples:
            last = tl.samples[-1][1] / files
        return last

    probes: list[tuple[uuid.UUID, str]] = []
    stop = threading.Event()
    threads = [threading.Thread(target=sampler, args=(system, tl, stop)),
               threading.Thread(target=faults, args=(system, tally, hf, tl, client, stop,
                                                     progress, min(1.0, files / 2000),
                                                     probes))]
    try:
        for t in threads:
            t.start()

        def one(item: tuple[str, bytes, str | None]) -> None:
            name, data, code = item
            file_id, version = client.upload(name, data)
            client.confirm(file_id, version)
            expected[file_id] = code

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, inputs))
        threads[1].join()
        # A probe whose confirm the cut refused is confirmed now, as a client would.
        for file_id, version in probes:
            client.confirm(file_id, version)
            expected[file_id] = None
        total = files + len(probes)
        wait_for(lambda: (tl.samples and tl.samples[-1][1] >= total) or None, timeout=1800,
                 interval=0.5, what="the queue to drain")
        drained = time.monotonic()
        wait_past_guard(system.db_url, GUARD)
        sweep = system.start("sweep", "sweep", "--once")
        assert sweep.wait(300) == 0, sweep.log()
        # Then what an operator runs after an incident: reconciliation of the bucket
        # against the database. Whatever it deletes was bytes nothing tracked.
        reconcile = system.start("sweep", "reconcile")
        assert reconcile.wait(300) == 0, reconcile.log()
        hf.reconcile_deleted = reconcile.log().count("\ndeleted ") + reconcile.log(
            ).startswith("deleted ")
        stop.set()
        threads[0].join()
        with psycopg.connect(system.db_url, autocommit=True, row_factory=dict_row) as db:
            outcome = verify(system, db, expected, deleted, tally,  # type: ignore[arg-type]
                             drain_seconds=drained - max(tally.last_fault, started),
                             total_seconds=time.monotonic() - started, n_hostile=n_hostile)
            check_hosts(db, hf, outcome)
        return HostsOutcome(outcome, hf, tl)
    finally:
        stop.set()
        for t in threads:
            t.join()
        system.stop()


def check_hosts(db: psycopg.Connection[dict[str, Any]], hf: HostFaults,
                outcome: Outcome) -> None:
    """What the partitions must have shown, beyond the end state chaos checks."""
    p = outcome.problems
    if hf.reconcile_deleted:
        p.append(f"reconcile deleted {hf.reconcile_deleted} untracked object(s)")
    if hf.link_cut_leases_held < 1:
        p.append("w1 held no lease when its link went down")
    if hf.probe_statuses.get("0"):
        p.append(f"{hf.probe_statuses['0']} upload(s) got no answer while the database was "
                 "cut")
    if hf.readyz_during_db_cut.get("503", 0) < 1:
        p.append(f"/readyz never answered 503 while the database was cut: "
                 f"{hf.readyz_during_db_cut}")
    if hf.readyz_max_seconds > 10:
        p.append(f"/readyz took {hf.readyz_max_seconds:.1f} s while the database was cut")
    bound = SESSION_OPTIONS["tcp_user_timeout"] / 1000 + 10
    if hf.api_slowest_call_during_db_cut > bound:
        p.append(f"an API call took {hf.api_slowest_call_during_db_cut:.1f} s while the "
                 f"database was cut (bound: the connections' user timeout + 10 s = {bound:g})")
    if hf.accepted_202_after_db_heal_s is None:
        p.append("no 202 after the database came back")
    # w1's attempts cut off from everything outlive their leases: each card it held must
    # have been taken over by another attempt and published by none of w1's tokens. Whether
    # w1 then tried a late write (recorded as lease_lost) or saw by its own clock that the
    # lease was gone and wrote nothing is its choice; both leave the card to the others.
    # One exception: a commit of w1's already on its way when the link went down (its
    # transaction began before) may have landed, its answer lost; the card is then w1's.
    for file_id, token in hf.link_cut_leases:
        row = db.execute(SQL["takeover_of_lease"],
                         {"id": file_id, "t": token, "cut": hf.link_cut_at}).fetchone()
        if row is not None and row["published_before_cut"] and not row["taken"]:
            continue
        if row is None or row["taken"] < 1:
            p.append(f"card {file_id}, held by w1 when its link went down, was not taken over")
        elif row["published"]:
            p.append(f"card {file_id} was settled by w1's attempt after its lease ran out")
