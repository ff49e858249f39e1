"""The inspector on the fleet page in real headless chromium: the charts of the last
minutes draw once the node's history has an interval, and the cell view shows a row written
through the public API, for an admin's key only.

With ``INSPECTOR_SCREENSHOT=<path>`` the test also saves the page there (that is how
docs/images/inspector.png is made). Every wait is a WebDriverWait; nothing sleeps (the
load thread paces its calls with an event's timeout, which is what it waits for).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from tests.helpers.served import ServedNode, served_node

pytestmark = pytest.mark.browser

WAIT = 60.0  # the first interval ends within one 5 s step; eight for the screenshot
ADMIN = "ak_admin_0123456789abcdef"
USER = "ak_user_0123456789abcdef0"
KEYS = {
    ADMIN: {"principal": "ops", "roles": ["admin"]},
    USER: {"principal": "someone", "roles": ["user"]},
}


def shown(driver: WebDriver, check: Callable[[WebDriver], object]) -> object:
    return WebDriverWait(
        driver, WAIT, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check)


@pytest.fixture
def keyed(tmp_path: Path) -> ServerSettings:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    return ServerSettings(authentication=Authentication([ApiKeys(path)]))


@pytest.fixture
def node(sw_bucket: S3Bucket, keyed: ServerSettings) -> Iterator[ServedNode]:
    with served_node(sw_bucket, "insp", keyed) as served:
        yield served


def load(http: httpx.Client, node: ServedNode, stop: threading.Event) -> None:
    """Calls on a few cells until ``stop``, so the charts have something to draw."""
    i = 0
    while not stop.wait(0.02):
        http.post(
            f"{node.public}/cells/Counter/load-{i % 4}/increment",
            json={"name": "n"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        i += 1


def chart_points(driver: WebDriver, chart: str, field: str) -> int:
    path = driver.find_element(By.CSS_SELECTOR, f'#{chart} path.series[data-field="{field}"]')
    d = path.get_attribute("d") or ""
    return int(path.get_attribute("data-points") or 0) if d.startswith("M") else 0


def click_first(driver: WebDriver, selector: str) -> bool:
    """Click the first element ``selector`` finds, if any (the table is redrawn every
    refresh: a stale row is retried by the wait)."""
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    if found:
        found[0].click()
    return bool(found)


def look(driver: WebDriver, cls: str, name: str, token: str) -> None:
    for field, value in (("inspect-class", cls), ("inspect-name", name), ("inspect-token", token)):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "inspect-go").click()


def test_charts_draw_and_the_cell_view_shows_a_written_row(
    node: ServedNode, browser: WebDriver, http: httpx.Client, tmp_path: Path
) -> None:
    answer = http.post(
        f"{node.public}/cells/Counter/shown/increment",
        json={"name": "visible-row", "by": 7},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 200, answer.text
    # The cell's first transaction shipped a database image; the second ships its rows.
    answer = http.post(
        f"{node.public}/cells/Counter/shown/increment",
        json={"name": "second-row"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert answer.status_code == 200, answer.text
    stop = threading.Event()
    loader = threading.Thread(target=load, args=(http, node, stop), daemon=True)
    loader.start()
    try:
        browser.set_window_size(1100, 1500)
        browser.get(node.internal + "/")
        wanted = 8 if os.environ.get("INSPECTOR_SCREENSHOT") else 1
        shown(browser, lambda d: chart_points(d, "chart-calls", "calls_per_s") >= wanted)
        assert chart_points(browser, "chart-bucket", "bucket_per_s") >= 1
        shown(browser, lambda d: chart_points(d, "chart-latency", "call_p50_ms") >= 1)

        # Without an admin's key the view is refused, and shows no row.
        look(browser, "Counter", "shown", USER)
        shown(browser, lambda d: "403" in d.find_element(By.ID, "inspect-status").text)
        assert "visible-row" not in browser.find_element(By.ID, "inspect-result").text

        look(browser, "Counter", "shown", ADMIN)
        shown(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#inspect-rows td"))
        cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#inspect-rows td")]
        assert cells[:4] == ["visible-row", "7", "second-row", "1"]
        shown(browser, lambda d: "second-row" in d.find_element(By.ID, "inspect-changes").text)

        # A click on a resident cell's row opens it (the key typed before is kept).
        shown(browser, lambda d: click_first(d, '#cells-body tr[data-cell="Counter:load-1"]'))
        shown(browser, lambda d: "Counter:load-1" in d.find_element(By.ID, "inspect-result").text)
        shown(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#inspect-rows td"))
        assert browser.find_element(By.CSS_SELECTOR, "#inspect-rows td").text == "n"
    finally:
        stop.set()
        loader.join(timeout=30)
    picture = tmp_path / "inspector.png"
    assert browser.save_screenshot(str(picture))
    assert picture.stat().st_size > 1000
    target = os.environ.get("INSPECTOR_SCREENSHOT")
    if target:
        shutil.copyfile(picture, target)
