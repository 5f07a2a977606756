"""Debian's headless Chromium for the page's tests (and bench/page.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

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


class Chromium:
    """One headless Chromium for one test, started at its first page (so a test's set-up,
    which may run an event loop of its own, comes before Playwright holds this thread's)."""

    def __init__(self, binary: str, playwright_api: Any) -> None:
        self.binary = binary
        self.api = playwright_api
        self.expect = playwright_api.expect
        self._playwright: Any = None
        self._browser: Any = None

    @property
    def browser(self) -> Any:
        if self._browser is None:
            self._playwright = self.api.sync_playwright().start()
            self._browser = self._playwright.chromium.launch(executable_path=self.binary,
                                                             args=CHROMIUM_ARGS)
        return self._browser

    def page(self, url: str | None = None, key: str | None = None, *, width: int = 1100,
             height: int = 820) -> Any:
        """A new page of that size, at `url` if given, with `key` saved as the API key."""
        page = self.browser.new_page(viewport={"width": width, "height": height})
        if url is not None:
            page.goto(url)
        if key is not None:
            page.get_by_test_id("key-input").fill(key)
            page.get_by_test_id("key-save").click()
        return page

    def close(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()
