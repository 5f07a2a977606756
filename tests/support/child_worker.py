"""Test-only entry point: a real worker whose decoder children run a test's child program.

    python -m tests.support.child_worker ACTION [ARG...] -- worker --concurrency N --name X

The worker is the product's own (`darkroom.worker.main`), given the test program through
its typed `child` parameter; only this module, which the product never imports, names a
hostile or hanging child. For `hang MARKER` where MARKER is not a FIFO, the marker is
created when a child announces its hang on stderr (the jailed child may create no file),
so a test can wait for "a decode in progress".
"""

from __future__ import annotations

import argparse
import logging
import stat
import sys
from pathlib import Path

from darkroom.config import load_settings
from darkroom.worker import main as worker_main
from tests.derive.hostile_child import hostile
from tests.derive.rogue_child import rogue


class _MarkHangs(logging.Filter):
    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.marker = marker

    def filter(self, record: logging.LogRecord) -> bool:
        if "hostile: hanging" in record.getMessage():
            self.marker.touch()
        return True


def main(argv: list[str]) -> int:
    split = argv.index("--")
    # `rogue ACTION …` names a tests.derive.rogue_child program, anything else a hostile one.
    program = rogue(*argv[1:split]) if argv[0] == "rogue" else hostile(*argv[:split])
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["worker"])
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv[split + 1:])
    if program == hostile(*program.args) and program.args[0] == "hang" and len(program.args) > 1:
        marker = Path(program.args[1])
        if not (marker.exists() and stat.S_ISFIFO(marker.stat().st_mode)):
            logging.getLogger("darkroom.sandbox.child").addFilter(_MarkHangs(marker))
    return worker_main(load_settings(), concurrency=args.concurrency, name=args.name,
                       metrics_port=None, child=program)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
