"""Test-only decoder children that attack the parent through what they answer and how.

`python -m tests.derive.rogue_child MEMORY_MB NICE CPU -- ACTION`, started by
`DecoderProcess(program=rogue("ACTION"))`. Like `tests.derive.hostile_child`, it serves
through the product's own `darkroom.decoder_child.main` (same jail, same protocol); each
job runs ACTION, a decoder already taken over by an image:

- `detail-list`: answers an error whose detail is a JSON list, not a string.
- `deep-json`: answers a frame whose meta is JSON nested past Python's recursion limit.
- `blame CODE`: answers the error CODE, one a decoder never gives (`storage_unavailable`,
  say), as if another component had failed.
- `rt-signal`: ends itself with a real-time signal, which has no name in `signal.Signals`.
- `spin`: answers a real derivative, then keeps burning CPU in a thread of its own while
  the parent believes it idle (SIGXCPU ignored, soft CPU limit raised to the hard one).
- `flood N`: writes N lines to stderr, then answers an error.

Nothing in the product can start this module: only a test passes it as the child program.
"""

from __future__ import annotations

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


def run(argv: list[str]) -> int:
    action, args = argv[argv.index("--") + 1], argv[argv.index("--") + 2:]

    def job(data: bytes, limits: Limits) -> tuple[dict[str, Any], bytes]:
        if action == "detail-list":
            return {"error_code": str(ErrorCode.PROCESSING_FAILED), "detail": ["oom"]}, b""
        if action == "deep-json":
            meta = b"[" * 60_000
            os.write(_RESPONSES, FRAME.pack(len(meta), 0) + meta)
            while True:  # the parent has all it will get
                signal.pause()
        if action == "blame":
            return {"error_code": args[0], "detail": "not my fault"}, b""
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
