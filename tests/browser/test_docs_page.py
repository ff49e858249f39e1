"""The ``/docs`` page in real headless Chromium: Swagger UI renders every operation of the
node's own document, on a node that authenticates (the page needs no credential, and
offers the bearer scheme), with no request to any other origin and no violation of the
page's Content-Security-Policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from tests.helpers.served import served_node
from tests.test_openapi import Wallet

pytestmark = pytest.mark.browser

#: Runs before the page's own scripts (CSP does not apply to it): records every violation.
RECORD_VIOLATIONS = """
window.violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.violations.push(e.violatedDirective + " " + e.blockedURI));
"""


def test_the_page_renders_every_operation_from_this_origin_only(
    browser: WebDriver, sw_bucket: S3Bucket, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"ak_user_0123456789abcdef01": {"principal": "a", "roles": []}}))
    settings = ServerSettings(authentication=Authentication([ApiKeys(keys)]))
    with served_node(sw_bucket, "n1", settings, classes=[Wallet]) as node:
        browser.execute_cdp_cmd(
            "Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS}
        )
        browser.get(f"{node.public}/docs")
        methods = ["balance", "close", "deposit", "quote", "receipt", "stamp"]
        WebDriverWait(browser, 30, poll_frequency=0.1).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")) == 6
        )
        paths = [
            e.text.replace("\u200b", "")
            for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
        ]
        assert sorted(paths) == [f"/cells/Wallet/{{name}}/{m}" for m in methods]
        assert browser.find_elements(By.CSS_SELECTOR, ".btn.authorize")  # the bearer scheme
        loaded = browser.execute_script(
            "return performance.getEntriesByType('resource').map((e) => e.name)"
        )
        assert loaded, "the page loaded nothing"
        assert [u for u in loaded if not u.startswith(node.public + "/")] == [], loaded
        assert browser.execute_script("return window.violations") == []
