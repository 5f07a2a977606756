"""The `darkroom` command (and `python -m darkroom`): SIGTERM and SIGINT are held from
this first line (signals.py), before the CLI's imports take their time; then the CLI."""

# ruff: noqa: E402 (the signals are held before the imports)
from __future__ import annotations

import sys

from darkroom import signals

signals.hold()

from darkroom.cli import main


def command() -> int:
    return main()


if __name__ == "__main__":
    sys.exit(command())
