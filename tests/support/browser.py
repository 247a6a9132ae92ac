"""Headless Chromium for the web page's tests: Debian's chromium (scripts/setup installs it)
driven by Playwright's sync API; Playwright's own browser downloads are never used. A test
module skips, saying why, when Playwright or Chromium is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = "/usr/bin/chromium"
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


def chromium_path() -> str | None:
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


@contextmanager
def chromium() -> Iterator:
    """A Playwright Browser on Debian's Chromium; skips the test when there is none."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright is not installed (pip install -e '.[dev]')"
    )
    path = chromium_path()
    if path is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/setup installs Debian's chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=path, args=CHROMIUM_ARGS, headless=True
        )
        try:
            yield browser
        finally:
            browser.close()
