"""The progress bar of the commands that wait on many files (`import`, `rederive`,
`retry`): one line on stderr, redrawn in place on a terminal, a few milestone lines in a log.

It is a few lines of our own rather than a library's because a log file must get whole
lines at milestones, not a stream of carriage returns, and it counts three outcomes.
"""

from __future__ import annotations

import sys
import threading
from typing import IO

ALREADY = "already there"


class Bar:
    """A one-line progress bar on stderr; redrawn in place on a terminal, and printed at
    a few milestones otherwise (so a log file gets lines, not carriage returns)."""

    WIDTH = 30

    def __init__(self, label: str, total: int, stream: IO[str] | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.failed = 0
        self.already = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._lock = threading.Lock()
        self._last_milestone = -1
        self._draw()

    def advance(self, *, failed: bool = False, already: bool = False) -> None:
        with self._lock:
            self.done += 1
            self.failed += int(failed)
            self.already += int(already)
            self._draw()

    def _draw(self) -> None:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        extra = f", {self.already} {ALREADY}" if self.already else ""
        extra += f", {self.failed} failed" if self.failed else ""
        line = f"{self.label:<8} [{bar}] {self.done}/{self.total}{extra}"
        if self.tty:
            self.stream.write("\r" + line)
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            milestone = int(fraction * 4)  # 0 %, 25 %, 50 %, 75 %, 100 %
            if milestone != self._last_milestone:
                self._last_milestone = milestone
                self.stream.write(line + "\n")
        self.stream.flush()
