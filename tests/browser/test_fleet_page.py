"""The fleet page in real headless chromium (Debian's, driven by its chromedriver through
selenium): two nodes on one SeaweedFS bucket, calls on a few cells, and the page of each
node showing the whole fleet, its own resident cells and its call rates as they change.

Every wait is a WebDriverWait on what the page shows; nothing sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.served import ServedNode, served_node

pytestmark = pytest.mark.browser

WAIT = 30.0  # upper bound of every wait; the page refreshes every 1.5 s


def increment(http: httpx.Client, via: ServedNode, cell: str) -> None:
    answer = http.post(f"{via.public}/cells/Counter/{cell}/increment", json={"name": "x"})
    assert answer.status_code == 200, answer.text


def shown(driver: WebDriver, check: Callable[[WebDriver], object]) -> object:
    """Wait until ``check`` holds for what the page shows (re-drawn rows are retried)."""
    return WebDriverWait(
        driver, WAIT, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check)


def fleet_rows(driver: WebDriver) -> dict[str, str]:
    """Node id -> "yes"/"no" (alive) for every row of the fleet table."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#fleet-body tr[data-node]")
    return {r.get_attribute("data-node") or "": r.get_attribute("data-alive") or "" for r in rows}


def cell_rows(driver: WebDriver) -> dict[str, list[str]]:
    """Cell id -> the texts of its row in the resident cells table."""
    rows = driver.find_elements(By.CSS_SELECTOR, "#cells-body tr[data-cell]")
    return {
        r.get_attribute("data-cell") or "": [td.text for td in r.find_elements(By.TAG_NAME, "td")]
        for r in rows
    }


def increment_rates(driver: WebDriver) -> list[str]:
    """The Counter.increment row of the rates table: ok/s, not_run/s, unknown/s, failed/s,
    total."""
    rows = driver.find_elements(
        By.CSS_SELECTOR, '#rates-body tr[data-cls="Counter"][data-method="increment"]'
    )
    return [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")][2:] if rows else []


def ok_rate(driver: WebDriver) -> float:
    """Counter.increment calls answered ok per second, as shown (0 until measured)."""
    rates = increment_rates(driver)
    try:
        return float(rates[0])
    except (IndexError, ValueError):
        return 0.0  # no row yet, or "…" before the second sample


def test_the_page_shows_the_fleet_its_cells_and_rates(
    sw_bucket: S3Bucket, http: httpx.Client, browser: WebDriver
) -> None:
    with served_node(sw_bucket, "page-a") as a:
        with served_node(sw_bucket, "page-b") as b:
            for cell in ("alpha", "alpha", "beta"):
                increment(http, a, cell)
            increment(http, b, "gamma")
            increment(http, a, "gamma")  # owned by b: a forwards it there

            browser.get(a.internal + "/")
            assert browser.title == "cellactors fleet"
            shown(browser, lambda d: fleet_rows(d) == {"page-a": "yes", "page-b": "yes"})
            shown(browser, lambda d: set(cell_rows(d)) == {"Counter:alpha", "Counter:beta"})
            alpha = cell_rows(browser)["Counter:alpha"]
            # cell, epoch, acked txid, committed txid, pending acks, last activity, source
            assert alpha[1] == "1" and alpha[2] == alpha[3] and alpha[4] == "0"
            assert alpha[5].endswith(" s ago") and alpha[6] == "new"
            assert browser.find_element(By.ID, "node-id").text == "page-a"
            assert browser.find_element(By.ID, "node-status").text == "serving"
            # Three calls ran here; the one for gamma ran on b.
            shown(browser, lambda d: increment_rates(d)[-1:] == ["3"])

            # Calls keep coming: the page shows a nonzero rate without being reloaded.
            stop = threading.Event()

            def load() -> None:
                with httpx.Client(timeout=30) as client:
                    while not stop.is_set():
                        increment(client, a, "alpha")

            writer = threading.Thread(target=load, name="page-load")
            writer.start()
            try:
                shown(browser, lambda d: ok_rate(d) > 0)
                shown(browser, lambda d: browser.find_element(By.ID, "rate-calls").text != "0.0 /s")
            finally:
                stop.set()
                writer.join(WAIT)
            assert not writer.is_alive()

            # The other node's row links to its own page: it hosts gamma.
            link = browser.find_element(By.CSS_SELECTOR, '#fleet-body tr[data-node="page-b"] a')
            assert link.get_attribute("href") == f"http://127.0.0.1:{b.internal_port}/"
            link.click()
            shown(browser, lambda d: d.find_element(By.ID, "node-id").text == "page-b")
            shown(browser, lambda d: set(cell_rows(d)) == {"Counter:gamma"})
            shown(browser, lambda d: fleet_rows(d) == {"page-a": "yes", "page-b": "yes"})
            browser.get(a.internal + "/")
            shown(browser, lambda d: fleet_rows(d) == {"page-a": "yes", "page-b": "yes"})
        # b drained and released its lease: a's page shows it expired, without a reload.
        shown(browser, lambda d: fleet_rows(d) == {"page-a": "yes", "page-b": "no"})
        row = browser.find_element(By.CSS_SELECTOR, '#fleet-body tr[data-node="page-b"]')
        assert "released" in row.text and "expired" in row.text
        assert not browser.find_elements(By.CSS_SELECTOR, "#status.error")
