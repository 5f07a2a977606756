"""Debian's headless Chromium for the page's tests (and bench/page.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_binary() -> str | None:
    for candidate in (
        os.environ.get("DARKROOM_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    return None
