"""Test-only decoder children that attack the parent through what they answer and how.

`python -m tests.derive.rogue_child MEMORY_MB NICE CPU -- ACTION`, started by
`DecoderProcess(program=rogue("ACTION"))`. Like `tests.derive.hostile_child`, it serves
through the product's own `darkroom.decoder_child.main` (same jail, same protocol); each
job runs ACTION, a decoder already taken over by an image:

- `detail-list`: answers an error whose detail is a JSON list, not a string.
- `deep-json`: answers a frame whose meta is JSON nested past Python's recursion limit.
- `blame CODE`: answers the error CODE, one a decoder never gives (`storage_unavailable`,
  say), as if another component had failed.
- `smuggle`: answers the real derivative with other bytes (here a stand-in for a key) added
  to the end of its `VP8 ` bitstream, where a decoder never looks.
- `whoami`: answers the uid it runs as and its pid, as an error detail.
- `rt-signal`: ends itself with a real-time signal, which has no name in `signal.Signals`.
- `huge-prefix`: a frame header announcing a 4 GiB payload, then silence.
- `partial-frame`: a frame header and half its meta, then silence.
- `spin`: answers a real derivative, then keeps burning CPU in a thread of its own while
  the parent believes it idle (SIGXCPU ignored, soft CPU limit raised to the hard one).
- `flood N`: writes N lines to stderr, then answers an error.
- `invalid-when-used`: derives its first job, then answers `invalid_image` for every
  later one, as a decoder whose heap kept from earlier jobs fails would.

Nothing in the product can start this module: only a test passes it as the child program.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import sys
import threading
from typing import Any

from darkroom.decoder_child import decode_job, main
from darkroom.derive import Limits
from darkroom.errors import DeriveError, ErrorCode
from darkroom.sandbox import ChildProgram
from darkroom.wire import FRAME

MODULE = "tests.derive.rogue_child"
# The child's response pipe: `serve` dups fd 1 to the first free descriptor, fd 3.
_RESPONSES = 3


def rogue(action: str, *args: str) -> ChildProgram:
    """The child program that runs `action` on every job."""
    return ChildProgram(MODULE, (action, *args))


def _spin() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    while True:
        pass


SECRET = b"-----BEGIN PRIVATE KEY-----\n" + b"A" * 2000 + b"\n-----END PRIVATE KEY-----\n"


def _smuggled(meta: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
    """The preview with `SECRET` inside its last chunk, sizes and sha256 made consistent."""
    thumb_size = meta["thumb"]["bytes"]
    preview, thumb = payload[:-thumb_size], payload[-thumb_size:]
    pos = 12
    while True:  # to the last chunk, the bitstream
        size = int.from_bytes(preview[pos + 4:pos + 8], "little")
        if pos + 8 + size + (size & 1) >= len(preview):
            break
        pos += 8 + size + (size & 1)
    assert preview[pos:pos + 4] == b"VP8 ", preview[pos:pos + 4]
    body = preview[pos + 8:pos + 8 + size] + SECRET
    chunk = b"VP8 " + len(body).to_bytes(4, "little") + body + b"\0" * (len(body) & 1)
    riff = preview[12:pos] + chunk
    preview = b"RIFF" + (4 + len(riff)).to_bytes(4, "little") + b"WEBP" + riff
    meta["sha256"] = hashlib.sha256(preview).hexdigest()
    return meta, preview + thumb


def run(argv: list[str]) -> int:
    action, args = argv[argv.index("--") + 1], argv[argv.index("--") + 2:]
    jobs = 0

    def job(data: bytes, limits: Limits) -> tuple[dict[str, Any], bytes]:
        nonlocal jobs
        jobs += 1
        if action == "invalid-when-used":
            if jobs == 1:
                return decode_job(data, limits)
            raise DeriveError(ErrorCode.INVALID_IMAGE, "jpeg decode")
        if action == "detail-list":
            return {"error_code": str(ErrorCode.PROCESSING_FAILED), "detail": ["oom"]}, b""
        if action in ("deep-json", "huge-prefix", "partial-frame"):
            meta = b"[" * 60_000
            os.write(_RESPONSES, {
                "deep-json": FRAME.pack(len(meta), 0) + meta,
                "huge-prefix": FRAME.pack(2, 0xFFFF_FFFF) + b"{}",
                "partial-frame": FRAME.pack(len(meta), 0) + meta[:30_000],
            }[action])
            while True:  # the parent has all it will get
                signal.pause()
        if action == "blame":
            return {"error_code": args[0], "detail": "not my fault"}, b""
        if action == "smuggle":
            return _smuggled(*decode_job(data, limits))
        if action == "whoami":
            raise DeriveError(ErrorCode.PROCESSING_FAILED, f"uid {os.getuid()} pid {os.getpid()}")
        if action == "rt-signal":
            os.kill(os.getpid(), signal.SIGRTMIN + 6)  # signals to itself are allowed
        if action == "spin":
            answer = decode_job(data, limits)
            signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # only the main thread may
            threading.Thread(target=_spin, daemon=True).start()
            return answer
        if action == "flood":
            line = b"x" * 200 + b"\n"
            for _ in range(int(args[0])):
                os.write(2, line)
            raise DeriveError(ErrorCode.PROCESSING_FAILED, "flooded")
        raise DeriveError(ErrorCode.PROCESSING_FAILED, f"unknown action {action}")

    return main(argv, job=job)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
