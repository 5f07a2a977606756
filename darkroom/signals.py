"""SIGTERM and SIGINT while `darkroom` starts: held from the command's first line.

A worker signalled while it starts must end cleanly (exit 0, nothing claimed), and its
start takes time before its own handlers are in place: the imports alone take a fraction
of a second, in which Python's defaults would kill it. So `darkroom` holds both signals
from its first line (`hold`), and each command then says what a signal means to it: the
worker reads what was held and stops at once; any other command lets them through
(`let_through`), ending as a signal would have ended it.
"""

from __future__ import annotations

import signal

STOPPING = (signal.SIGTERM, signal.SIGINT)
# The signals received since `hold`, in order.
held: list[int] = []


def _note(number: int, _frame: object) -> None:
    held.append(number)


def hold() -> None:
    """From now on SIGTERM and SIGINT are noted in `held`, not acted on."""
    for sig in STOPPING:
        signal.signal(sig, _note)


def let_through() -> None:
    """Python's own handlers back, and what was held delivered now."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for number in held:
        signal.raise_signal(number)
