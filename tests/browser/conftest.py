"""The browser tests need selenium (the ``browser`` extra, installed by ``tox -e browser``).
Without it they are not collected, so the other environments need not install it; the
browser environment runs ``-m browser`` and fails when nothing is collected.

The ``browser`` fixture is shared by every browser test: Debian's headless chromium driven
by its chromedriver, never a downloaded browser or driver."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from selenium.webdriver.chrome.webdriver import WebDriver

collect_ignore_glob = [] if importlib.util.find_spec("selenium") else ["test_*.py"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@pytest.fixture
def make_browser(tmp_path: Path) -> Iterator[Callable[[], WebDriver]]:
    """Start headless chromiums, each with a fresh profile (a test with two pages open at
    once, as two people would); every one is quit at teardown. Never downloads a browser
    or driver."""
    # Imported here: this conftest is loaded where selenium is not installed too.
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        # tox -e browser installs them first (tests/browser/install-chromium.sh).
        pytest.fail(f"{', '.join(missing)} missing: apt-get install chromium chromium-driver")
    drivers: list[WebDriver] = []

    def make() -> WebDriver:
        options = Options()
        options.binary_location = CHROMIUM
        for arg in ARGS:
            options.add_argument(arg)
        options.add_argument(f"--user-data-dir={tmp_path / f'chromium-profile-{len(drivers)}'}")
        driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        drivers.append(driver)
        return driver

    try:
        yield make
    finally:
        for driver in drivers:
            driver.quit()


@pytest.fixture
def browser(make_browser: Callable[[], WebDriver]) -> WebDriver:
    """Headless chromium with a fresh profile; never downloads a browser or driver."""
    return make_browser()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as client:
        yield client
