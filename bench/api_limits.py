"""What the API's limits cost: GET /v1/files/{id} flat out against two `darkroom api`
processes on one database, this tree and another (e.g. main before a set of limits), in
interleaved rounds of one run, so the ratio is of the same minutes of the same machine.
Judged against `bench.targets.API_LIMITS_COST`.

    git archive <commit> darkroom | tar -x -C /tmp/before
    .venv/bin/python -m bench.api_limits --before /tmp/before [--rounds 6] [--seconds 4]
        [--clients 32]

Each round runs both, in alternating order; the answer is each round's ratio of requests
per second (this tree / the other) and their median, each server's CPU per request, and
the HTTP layer's own CPU per request in each tree (bench/http_layer.py). On a shared
machine the rounds' requests/s spread far wider than the 2 % target; the verdict is then
taken from the HTTP layer, where the limits live.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.api import System
from bench.loadgen import LoadClient
from bench.targets import API_LIMITS_COST
from darkroom.keys import create_key_at
from tests.support.services import free_port


def start(system: System, pythonpath: str | None, port: int, name: str
          ) -> subprocess.Popen[bytes]:
    env = dict(system.env)
    # Each process imports darkroom from its own tree only: `-P` keeps `-m` from putting
    # the working directory (this tree) ahead of PYTHONPATH, which would make both
    # processes this tree.
    env["PYTHONPATH"] = pythonpath or str(Path(__file__).resolve().parents[1])
    log = (system.tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "darkroom.cli", "api", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError((system.tmp / f"{name}.log").read_text())


def _http_layer(tree: str | None) -> float:
    here = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-P", "-m", "bench.http_layer"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tree, here) if p)},
        capture_output=True, text=True, check=True, timeout=300)
    return float(out.stdout.strip())


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (proc(5): fields 14 and 15, in ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def closed_loop(url: str, key: str, path: str, seconds: float, clients: int) -> float:
    done = 0
    deadline = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        async with LoadClient(url, {"Authorization": f"Bearer {key}"}, 1) as client:
            while time.monotonic() < deadline:
                answer = await client.get(path)
                if answer.status_code != 200:
                    raise RuntimeError(f"answered {answer.status_code}")
                done += 1

    await asyncio.gather(*(one() for _ in range(clients)))
    return done / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="a darkroom tree to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        system = System(Path(tmp), None)
        ports = {"before": free_port(), "this": free_port()}
        procs = [start(system, args.before, ports["before"], "before"),
                 start(system, None, ports["this"], "this")]
        try:
            key = asyncio.run(create_key_at(system.db_url, "bench"))
            with httpx.Client(base_url=f"http://127.0.0.1:{ports['this']}",
                              headers={"Authorization": f"Bearer {key}"}) as c:
                card = c.post("/v1/files", json={"filename": "a.jpg",
                                                 "content_type": "image/jpeg",
                                                 "size": 10}).json()
            path = f"/v1/files/{card['id']}"

            pids = dict(zip(ports, (p.pid for p in procs), strict=True))
            cpu: dict[str, list[float]] = {"before": [], "this": []}

            def run(name: str, seconds: float) -> float:
                used = _cpu_seconds(pids[name])
                rate = asyncio.run(closed_loop(f"http://127.0.0.1:{ports[name]}", key, path,
                                               seconds, args.clients))
                # The server's own CPU per request: on a shared machine, far steadier than
                # requests/s, which also carries what the neighbours take.
                cpu[name].append((_cpu_seconds(pids[name]) - used) / (rate * seconds) * 1e6)
                return rate

            for name in ports:  # warm-up
                run(name, 2.0)
                cpu[name].clear()
            rates: dict[str, list[float]] = {"before": [], "this": []}
            for r in range(args.rounds):
                for name in (("before", "this") if r % 2 == 0 else ("this", "before")):
                    rates[name].append(run(name, args.seconds))
            ratios = [b / a for a, b in zip(rates["before"], rates["this"], strict=True)]
            print("requests/s:", {k: [round(x) for x in v] for k, v in rates.items()})
            median = statistics.median(ratios)
            print("this / before per round:", [round(x, 3) for x in ratios],
                  "median", round(median, 3))
            spread = max(ratios) - min(ratios)
            print(f"requests/s cost {1 - median:+.1%} (rounds spread over {spread:.0%})")
            print("server CPU per request per round, µs:",
                  {k: [round(x) for x in v] for k, v in cpu.items()})
            per = {k: statistics.median(v) for k, v in cpu.items()}
            print("server CPU per request, µs (median of rounds):",
                  {k: round(v, 1) for k, v in per.items()},
                  f"this / before {per['this'] / per['before']:.3f}")
            # The HTTP layer alone (bench/http_layer.py), where the limits live: its CPU
            # per request in each tree, and the difference as a share of a whole request.
            layer: dict[str, list[float]] = {"before": [], "this": []}
            for r in range(args.rounds):
                for name in (("before", "this") if r % 2 == 0 else ("this", "before")):
                    layer[name].append(_http_layer(args.before if name == "before" else None))
            mid = {k: statistics.median(v) for k, v in layer.items()}
            print("HTTP layer CPU per request, µs:", {k: [round(x, 1) for x in v]
                                                      for k, v in layer.items()},
                  "median", {k: round(v, 1) for k, v in mid.items()},
                  f"difference {mid['this'] - mid['before']:+.1f} µs = "
                  f"{(mid['this'] - mid['before']) / per['before']:+.2%} of a request's CPU")
            # The verdict: requests/s when the rounds agree to within the target; else, on
            # a machine too busy for that, the HTTP layer's difference (a CPU-bound API
            # loses that share of its requests/s).
            cost = (1 - median if spread <= API_LIMITS_COST
                    else (mid["this"] - mid["before"]) / per["before"])
            basis = "requests/s" if spread <= API_LIMITS_COST else "the HTTP layer's CPU"
            print(f"cost {cost:+.2%} by {basis} (target <= {API_LIMITS_COST:.0%}):",
                  "met" if cost <= API_LIMITS_COST else "NOT met")
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(20)
            system.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
