"""Cross-site request forgery in real headless chromium: a page on another site tries every
way a browser lets it send a call to a node's public listener without the node's consent
(no-cors fetches and form posts, which need no CORS preflight, and a JSON fetch, which
does). None of them may run: the node answers 415 to a body that is neither JSON nor msgpack
and grants no preflight (CORS is off by default).

Each attempt targets a cell of its own, with a body that would increment its counter if the
node ran it, so the cells' state shows whether anything ran, and the node's access log shows
what it answered to each attempt. Every wait polls with a deadline; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.served import served_node

pytestmark = pytest.mark.browser

WAIT = 15.0  # upper bound of every wait
#: Attempt (and the cell it targets) -> how the page must see it end: no-cors fetches get
#: an opaque answer, the forms' iframes load the node's (error) answer, and the CORS fetch
#: is refused by the browser, its preflight not granted.
ATTEMPTS = {
    "nocors-fetch": "answered opaque",
    "nocors-text-fetch": "answered opaque",
    "text-form": "loaded",
    "urlencoded-form": "loaded",
    "cors-json-fetch": "refused TypeError",
}
PREFLIGHTED = "cors-json-fetch"
#: A text/plain form sends ``<field>=<value>\r\n``: with this field and value the body is
#: the JSON object ``{"name": "x="}`` (the trailing CRLF is JSON whitespace).
FORM_FIELD, FORM_VALUE = '{"name": "x', '"}'
NAMES = ("x", "x=")  # every counter an attempt would have incremented

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>attacker</title></head><body><script>
const node = %(node)s;
window.results = {};
function url(cell) { return node + "/cells/Counter/" + cell + "/increment"; }
function done(key, how) { window.results[key] = how; }
function fetched(key, init) {
  fetch(url(key), init).then(
    (answer) => done(key, "answered " + answer.type),
    (error) => done(key, "refused " + error.name));
}
function posted(key, enctype, field, value) {
  const frame = document.createElement("iframe");
  frame.name = key;
  document.body.appendChild(frame);
  frame.addEventListener("load", () => {
    // Still about:blank (same origin) until the node's answer (another origin) is loaded.
    try { frame.contentWindow.location.href; } catch (e) { done(key, "loaded"); }
  });
  const form = document.createElement("form");
  form.method = "POST";
  form.enctype = enctype;
  form.action = url(key);
  form.target = key;
  const input = document.createElement("input");
  input.type = "hidden";
  input.name = field;
  input.value = value;
  form.appendChild(input);
  document.body.appendChild(form);
  form.submit();
}
const body = JSON.stringify({name: "x"});
fetched("nocors-fetch", {method: "POST", mode: "no-cors", body: body});
fetched("nocors-text-fetch",
        {method: "POST", mode: "no-cors", body: body, headers: {"content-type": "text/plain"}});
posted("text-form", "text/plain", %(field)s, %(value)s);
posted("urlencoded-form", "application/x-www-form-urlencoded", "name", "x");
fetched("cors-json-fetch",
        {method: "POST", body: body, headers: {"content-type": "application/json"}});
</script></body></html>
"""


class AccessLog(logging.Handler):
    """The (method, path, status) of every answer uvicorn logs to ``uvicorn.access``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.answers: list[tuple[str, str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        # uvicorn's access record: (client, method, path and query, HTTP version, status).
        # Never raise here: it would break the answer being logged.
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[4], int):
            self.answers.append((str(args[1]), str(args[2]), args[4]))


@contextlib.contextmanager
def access_log() -> Iterator[AccessLog]:
    """Collect ``uvicorn.access`` records for the block (give ``access_log=True`` to the
    node); the logger's level and handlers are restored after."""
    logger = logging.getLogger("uvicorn.access")
    handler, level = AccessLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextlib.contextmanager
def attacker_site(page: str) -> Iterator[str]:
    """Serve ``page`` at ``/`` of another site, ``http://localhost:<port>/`` (the node is
    reached as 127.0.0.1), until the block ends; yields its address."""
    content = page.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/"
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(content) if found else 0))
            self.end_headers()
            if found:
                self.wfile.write(content)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the test's output is the node's answers

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="attacker-site", daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(WAIT)


def test_a_page_on_another_site_cannot_run_a_call(
    sw_bucket: S3Bucket, http: httpx.Client, browser: WebDriver
) -> None:
    with access_log() as log, served_node(sw_bucket, "csrf", access_log=True) as node:
        page = PAGE % {
            "node": json.dumps(node.public),
            "field": json.dumps(FORM_FIELD),
            "value": json.dumps(FORM_VALUE),
        }
        with attacker_site(page) as site:
            browser.get(site)
            assert browser.title == "attacker"
            results = WebDriverWait(browser, WAIT, poll_frequency=0.1).until(
                lambda d: (r := d.execute_script("return window.results")) and len(r) == 5 and r
            )
        assert results == ATTEMPTS

        # Every attempt reached the node, and nothing ran: no counter moved.
        for cell in ATTEMPTS:
            for name in NAMES:
                answer = http.post(f"{node.public}/cells/Counter/{cell}/get", json={"name": name})
                assert answer.status_code == 200, answer.text
                assert answer.json() == {"result": 0}, (cell, name)
        # The node answered each body-carrying attempt 415, before reading its body; the
        # JSON one never came: its preflight was refused.
        answers = {(m, p, s) for m, p, s in log.answers if p.endswith("/increment")}
        sent = {f"/cells/Counter/{cell}/increment" for cell in ATTEMPTS if cell != PREFLIGHTED}
        assert {(m, p) for m, p, _ in answers} == {("POST", p) for p in sent} | {
            ("OPTIONS", f"/cells/Counter/{PREFLIGHTED}/increment")
        }, answers
        assert {s for m, _, s in answers if m == "POST"} == {415}, answers
        preflight = http.options(
            f"{node.public}/cells/Counter/{PREFLIGHTED}/increment",
            headers={
                "Origin": site.rstrip("/"),
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert "access-control-allow-origin" not in preflight.headers, preflight.headers

        # The same call, from a client that declares its JSON, runs: the page's calls were
        # addressed right, and were refused for what they were.
        answer = http.post(f"{node.public}/cells/Counter/text-form/increment", json={"name": "x="})
        assert answer.json() == {"result": 1}, answer.text
