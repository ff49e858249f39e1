"""A real browser's ``EventSource`` follows a cell's change feed from a page on another
origin (CORS allowed for it): every transaction once, in txid order, across the reconnects
that each end of a stream's lifetime causes (the browser resumes with ``Last-Event-ID``).
Every wait polls with a deadline; nothing sleeps."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server.app import ServerSettings
from tests.helpers.cells import Counter
from tests.helpers.served import served_node

pytestmark = pytest.mark.browser

WAIT = 15.0  # upper bound of every wait
#: The page follows the node named in its query string; each stream lasts one second.
PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>follower</title></head><body><script>
window.ids = []; window.opens = 0; window.failures = [];
const node = new URLSearchParams(location.search).get("node");
const feed = new EventSource(node + "/cells/Counter/a/changes?after=0&wait=1");
feed.onopen = () => { window.opens += 1; };
feed.onmessage = (e) => { window.ids.push(Number(e.lastEventId)); };
feed.addEventListener("feed-error", (e) => { window.failures.push(e.data); });
</script></body></html>"""


@contextlib.contextmanager
def app_site() -> Iterator[str]:
    """Serve :data:`PAGE` on another origin than the node's (``localhost`` vs
    ``127.0.0.1``) until the block ends; yields its origin."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="app-site", daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


def test_event_source_resumes_after_each_reconnect(sw_bucket: S3Bucket, browser: WebDriver) -> None:
    with app_site() as origin:
        settings = ServerSettings(
            cors_origins=(origin,), feed_poll_interval=0.05, feed_retry=0.1, feed_heartbeat=0.3
        )
        with served_node(sw_bucket, "ev", settings) as served:
            cell = served.node.cell(Counter, "a")
            for _ in range(2):
                cell.increment("x")  # txid 1 creates the table: txids 1..3
            browser.get(f"{origin}/?node={served.public}")
            assert browser.title == "follower"

            def page(expr: str, check: Any) -> Any:
                return WebDriverWait(browser, WAIT, poll_frequency=0.1).until(
                    lambda d: check(v := d.execute_script(f"return {expr}")) and v
                )

            assert page("window.ids", lambda ids: len(ids) >= 3) == [1, 2, 3]
            opened = page("window.opens", lambda n: n >= 2)  # a stream ended, it reconnected
            cell.increment("x")
            cell.increment("x")
            assert page("window.ids", lambda ids: len(ids) >= 5) == [1, 2, 3, 4, 5]
            page("window.opens", lambda n: n > opened)  # and again, after live events
            cell.increment("x")
            assert page("window.ids", lambda ids: len(ids) >= 6) == [1, 2, 3, 4, 5, 6]
            assert browser.execute_script("return window.failures") == []
