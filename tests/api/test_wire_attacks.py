"""Strangers on many addresses against a real `darkroom api` process: what they must not
take from a client with a valid key of its own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.services import DarkroomProcess, free_port, wait_for

# Loopback addresses standing for distinct clients (Linux routes all of 127/8 to lo).
FLOOD_ADDRESSES = [f"127.0.3.{i}" for i in range(2, 102)]
VICTIM_ADDRESS = "127.0.4.2"


@dataclass
class LiveApi:
    port: int
    env: dict[str, str]
    proc: DarkroomProcess

    def new_key(self, owner: str) -> str:
        out = subprocess.run([sys.executable, "-m", "darkroom.cli", "keys", "create",
                              "--owner", owner], env=self.env, capture_output=True,
                             text=True, timeout=60, check=True)
        return out.stdout.strip().split()[-1]


@contextlib.contextmanager
def running_api(db_url: str, tmp_path: Path, **settings: str) -> Iterator[LiveApi]:
    """`darkroom api` with `settings` (DARKROOM_… names without the prefix)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DARKROOM_")},
           "DARKROOM_DATABASE_URL": db_url,
           "DARKROOM_STORAGE_URL": (tmp_path / "objects").as_uri(),
           "DARKROOM_DATA_DIR": str(tmp_path / "data"),
           **{f"DARKROOM_{name.upper()}": value for name, value in settings.items()}}
    port = free_port()
    proc = DarkroomProcess(["api", "--port", str(port)], env, tmp_path / "api.log")

    def up() -> bool:
        assert proc.proc.poll() is None, proc.log()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(up, timeout=60, what="the API")
        yield LiveApi(port, env, proc)
    finally:
        proc.stop()


@pytest.fixture
def live_api(db_url: str, tmp_path: Path) -> Iterator[LiveApi]:
    with running_api(db_url, tmp_path) as api:
        yield api


async def _get(port: int, source: str, key: str, timeout: float = 30.0) -> int:
    """One `GET /v1/files` with `key`, from `source`, on a connection of its own."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), timeout)
    try:
        writer.write(f"GET /v1/files HTTP/1.1\r\nHost: darkroom\r\nAuthorization: Bearer {key}"
                     "\r\nConnection: close\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), timeout)
        return int(answer.split(b" ", 2)[1])
    finally:
        writer.close()


def test_a_never_seen_valid_key_is_served_while_strangers_guess_from_many_addresses(
        live_api: LiveApi) -> None:
    """A hundred addresses, eight connections each, send made-up keys until the unknown-key
    budget of every address together is spent and lookups go through the single lane. A
    valid key the process has never seen (a new user's, or anyone's after a restart),
    sent from an address of its own, is still served: the strangers' many connections
    do not make its wait for the lane longer than the lane's wait."""
    fresh = live_api.new_key("newcomer")
    port = live_api.port

    async def attack() -> tuple[int, Counter[int]]:
        seen: Counter[int] = Counter()
        stop = asyncio.Event()
        lane_full = asyncio.Event()
        failures: Counter[str] = Counter()
        deadline = time.monotonic() + 120  # the flood ends by itself whatever happens

        async def guess(source: str) -> None:
            # One keep-alive connection, one made-up key after another; a connection the
            # server drops is opened again, as an attacker would.
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    await guess_on_one_connection(source)
                except ConnectionRefusedError:
                    failures["ConnectionRefusedError"] += 1
                    return  # nobody listens: the wait below reports it
                except (ConnectionError, asyncio.IncompleteReadError) as exc:
                    failures[type(exc).__name__] += 1

        async def guess_on_one_connection(source: str) -> None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=(source, 0))
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    key = "dk_" + secrets.token_urlsafe(32)
                    writer.write(f"GET /v1/files HTTP/1.1\r\nHost: darkroom\r\n"
                                 f"Authorization: Bearer {key}\r\n\r\n".encode())
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                    length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    status = int(head.split(b" ", 2)[1])
                    seen[status] += 1
                    if status == 429:
                        lane_full.set()
            finally:
                writer.close()

        flood = [asyncio.create_task(guess(a)) for a in FLOOD_ADDRESSES for _ in range(8)]
        everyone = asyncio.gather(*flood, return_exceptions=True)
        try:
            # The budget is spent and the lane in use once strangers start being refused;
            # if the whole flood ends first, it says why rather than leaving a silent wait.
            waiter = asyncio.ensure_future(lane_full.wait())
            watched: set[asyncio.Future[Any]] = {waiter, everyone}
            await asyncio.wait(watched, timeout=deadline - time.monotonic(),
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if not lane_full.is_set():
                ended = ({repr(r) for r in everyone.result() if r is not None}
                         if everyone.done() else "still guessing")
                pytest.fail(f"no stranger was refused: answers {dict(seen)}, "
                            f"dropped connections {dict(failures)}, flood {ended}")
            status = await _get(port, VICTIM_ADDRESS, fresh)
        finally:
            stop.set()
            await everyone
        return status, seen

    status, seen = asyncio.run(attack())
    assert set(seen) <= {401, 429}, seen
    assert seen[429] > 0, seen
    assert status == 200


def test_idle_connections_from_a_few_addresses_do_not_deny_healthz(live_api: LiveApi) -> None:
    """Seventeen addresses open their allowance of connections each and send nothing;
    another client's /healthz is still answered."""
    port = live_api.port
    per_client = 64  # DARKROOM_API_MAX_CONNECTIONS_PER_CLIENT's default

    async def attack() -> tuple[int, int, bytes]:
        writers: list[asyncio.StreamWriter] = []
        try:
            for a in range(2, 19):
                for _ in range(per_client):
                    _, writer = await asyncio.open_connection(
                        "127.0.0.1", port, local_addr=(f"127.0.6.{a}", 0))
                    writers.append(writer)
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(VICTIM_ADDRESS, 0))
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: darkroom\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return len(writers), int(answer.split(b" ", 2)[1]), answer
        finally:
            for w in writers:
                w.close()

    held, status, answer = asyncio.run(attack())
    assert held == 17 * per_client
    assert status == 200, answer


@pytest.mark.parametrize("target", ["/v1/%65vents", "http://darkroom/v1/events"])
def test_streams_spelled_otherwise_are_still_counted_as_streams(
        db_url: str, tmp_path: Path, target: str) -> None:
    """An event stream asked for with its path percent-encoded, or in absolute form, is
    the same stream: it is counted in the streams' pool, not in the requests' one, where
    long-lived streams would take the place of everyone's requests."""
    with running_api(db_url, tmp_path, api_max_connections="3") as api:
        key = api.new_key("lurker")

        async def attack() -> bytes:
            writers: list[asyncio.StreamWriter] = []
            try:
                for n in range(2):
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", api.port, local_addr=(f"127.0.10.{n + 2}", 0))
                    writers.append(writer)
                    writer.write(f"GET {target} HTTP/1.1\r\nHost: darkroom\r\n"
                                 f"Authorization: Bearer {key}\r\n\r\n".encode())
                    opened = await asyncio.wait_for(reader.readuntil(b"event: open"), 30)
                    assert opened.startswith(b"HTTP/1.1 200 "), opened
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", api.port, local_addr=(VICTIM_ADDRESS, 0))
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: darkroom\r\n"
                             b"Connection: close\r\n\r\n")
                answer = await asyncio.wait_for(reader.read(), 30)
                writer.close()
                return answer
            finally:
                for w in writers:
                    w.close()

        answer = asyncio.run(attack())
    assert answer.startswith(b"HTTP/1.1 200 "), answer
