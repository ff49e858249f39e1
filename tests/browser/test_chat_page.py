"""The chat page (``examples/chat.html``) in real headless chromium, on a fleet of two
``cellactors serve`` nodes running ``examples/chat.py`` on a fresh SeaweedFS bucket.

Two people, each in their own browser, chat through different nodes; the node owning the
room is then killed (SIGKILL) with both pages open. The page whose socket that node held
resumes it on the other node, and every line said before and after the kill shows on both
pages exactly once, in the room's order. A page served from an origin the nodes do not
allow cannot open a socket at all.

Every wait polls what the pages show (or what the nodes say) with a deadline; nothing
sleeps.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin, Subprotocol

from cellactors.persistence.store.embedded import SeaweedServer
from tests.helpers.fleet import REPO, Fleet, NodeProc, wait_for
from tests.helpers.stores import make_s3_bucket

pytestmark = pytest.mark.browser

EXAMPLES = REPO / "examples"
CHAT_APP = EXAMPLES / "chat.py"
WAIT = 60.0  # upper bound of every wait: a takeover waits out a 2 s lease, then resumes
ROOM = "lobby"


@contextlib.contextmanager
def static_site(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP on loopback (a port of its own) until the block ends;
    yields the site's origin."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="static-site", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def chat_fleet(tmp_path: Path, seaweed: SeaweedServer) -> Iterator[tuple[Fleet, str]]:
    """The page's site, and two nodes serving the chat cells that allow its origin (lease
    TTL 2 s) on a fresh bucket; yields the fleet, not started, and the site's origin. The
    test starts it once its browsers are up: starting a chromium keeps a small machine busy
    for seconds, long enough to starve a 2 s lease's renewals."""
    bucket = make_s3_bucket(seaweed.endpoint)
    with static_site(EXAMPLES) as site:
        fleet = Fleet(
            [
                NodeProc(
                    f"chat-{i}",
                    CHAT_APP,
                    tmp_path / f"n{i}",
                    f"s3://{bucket.bucket}",
                    seaweed.endpoint,
                    lease_ttl=2.0,
                    extra=["--cors-origin", site],
                )
                for i in range(2)
            ]
        )
        try:
            yield fleet, site
        finally:
            fleet.stop()


def ws_url(node: NodeProc) -> str:
    return f"ws://127.0.0.1:{node.public_port}"


def open_page(driver: WebDriver, site: str, name: str, nodes: list[NodeProc]) -> None:
    query = urlencode({"nodes": ",".join(ws_url(n) for n in nodes), "room": ROOM, "name": name})
    driver.get(f"{site}/chat.html?{query}")


def shown(driver: WebDriver, what: str, check: Callable[[WebDriver], object]) -> Any:
    """Wait until ``check`` holds for what the page shows (re-drawn rows are retried)."""
    return WebDriverWait(
        driver, WAIT, poll_frequency=0.1, ignored_exceptions=(StaleElementReferenceException,)
    ).until(check, message=f"waiting for {what}")


def state(driver: WebDriver) -> dict[str, Any]:
    """What the page knows of its socket (``window.chat``)."""
    value: dict[str, Any] = driver.execute_script(
        "const c = window.chat; return {id: c.id, seq: c.seq, node: c.node, opens: c.opens,"
        " resumes: c.resumes, failures: c.failures, duplicates: c.duplicates,"
        " closed: c.closed, drops: c.drops, resent: c.resent,"
        " status: document.getElementById('status').dataset.state};"
    )
    return value


def lines(driver: WebDriver) -> list[str]:
    """The texts of the lines the page shows, top to bottom."""
    texts: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('#lines li.line .text'),"
        " (e) => e.textContent);"
    )
    return texts


def said_all(driver: WebDriver, texts: list[str]) -> bool:
    """Whether the page shows every one of ``texts``."""
    return set(texts) <= set(lines(driver))


def is_open(driver: WebDriver) -> bool:
    return bool(state(driver)["status"] == "open")


def say(driver: WebDriver, text: str) -> None:
    """Type ``text`` into the page's box and press Enter."""
    box = driver.find_element(By.ID, "text")
    box.send_keys(text, Keys.ENTER)


def test_two_pages_chat_across_the_kill_of_the_rooms_node(
    chat_fleet: tuple[Fleet, str], make_browser: Callable[[], WebDriver]
) -> None:
    fleet, site = chat_fleet
    ann, bo = make_browser(), make_browser()
    fleet.start()
    open_page(ann, site, "ann", [fleet[0], fleet[1]])
    shown(ann, "ann's page to connect", is_open)
    open_page(bo, site, "bo", [fleet[1], fleet[0]])
    shown(bo, "bo's page to connect", is_open)
    assert ann.find_element(By.ID, "room").text == ROOM
    # Each page's socket is held by the node it was given first.
    assert state(ann)["node"] == 0 and state(bo)["node"] == 0
    shown(
        ann,
        "bo joining, on ann's page",
        lambda d: "bo joined" in d.find_element(By.ID, "lines").text,
    )

    said: list[str] = []
    for i in range(3):
        for name, driver in (("ann", ann), ("bo", bo)):
            text = f"{name} before {i}"
            say(driver, text)
            said.append(text)
            # One at a time: then the room's order is the order said.
            shown(ann, f"{text!r} on ann's page", lambda d, t=text: t in lines(d))  # type: ignore[misc]
    shown(bo, "every line on bo's page", lambda d: lines(d) == said)
    assert lines(ann) == said

    cell_id = f"ChatRoom:{ROOM}"
    owner, _ = fleet.owner(cell_id)
    survivor = fleet[1] if owner is fleet[0] else fleet[0]
    # The page whose socket the owner holds must resume; the other one keeps its socket.
    moved = ann if owner is fleet[0] else bo
    stayed = bo if moved is ann else ann
    before = {"moved": state(moved), "stayed": state(stayed)}
    owner.kill()

    # Both say something at once, without waiting for anything: the moved page before it
    # even noticed (or while it resumes), the other while the room has no owner.
    after = []
    for i in range(3):
        for driver, who in ((moved, "moved"), (stayed, "stayed")):
            text = f"{who} after {i}"
            say(driver, text)
            after.append(text)

    wait_for(f"{cell_id} to move to {survivor.node_id}", lambda: cell_id in survivor.hosted(), WAIT)
    shown(moved, "every line said after the kill on the moved page", lambda d: said_all(d, after))
    shown(stayed, "every line said after the kill on the other page", lambda d: said_all(d, after))
    shown(moved, "the moved page to be open again", is_open)

    # Each page shows every line once; both in the same order, the room's.
    room = httpx.post(
        f"{survivor.public_url}/cells/ChatRoom/{ROOM}/lines", json={"limit": 100}, timeout=30
    )
    assert room.status_code == 200, room.text
    stored = [line["text"] for line in room.json()["result"]]
    assert sorted(stored) == sorted(said + after)
    assert stored[: len(said)] == said
    shown(moved, "the moved page to show the room", lambda d: lines(d) == stored)
    shown(stayed, "the other page to show the room", lambda d: lines(d) == stored)

    moved_now, stayed_now = state(moved), state(stayed)
    # The moved page resumed its socket on the survivor (no fresh socket: no history
    # again), and kept its id; the other kept its socket all along.
    assert moved_now["id"] == before["moved"]["id"]
    assert moved_now["opens"] == 1 and moved_now["resumes"] >= 1, moved_now
    assert moved_now["closed"] is None and stayed_now["closed"] is None
    assert stayed_now["id"] == before["stayed"]["id"]
    assert stayed_now["opens"] == 1 and stayed_now["resumes"] == 0, stayed_now
    # The moved page is now on the survivor, the first other node in its list.
    assert moved_now["node"] == 1
    # Nobody left: the resumed socket never closed on the room.
    assert "left" not in moved.find_element(By.ID, "lines").text
    assert "left" not in stayed.find_element(By.ID, "lines").text


def test_a_page_from_an_origin_not_allowed_cannot_open_a_socket(
    chat_fleet: tuple[Fleet, str], browser: WebDriver
) -> None:
    fleet, site = chat_fleet
    browser.get("about:blank")
    fleet.start()
    with static_site(EXAMPLES) as elsewhere:
        assert elsewhere != site
        open_page(browser, elsewhere, "mallory", list(fleet))
        # Every node refused its handshake (each try closes before a hello)...
        shown(browser, "both nodes to refuse the page", lambda d: state(d)["failures"] >= 2)
        page = state(browser)
        assert page["opens"] == 0 and page["resumes"] == 0 and page["id"] == "", page
        assert page["status"] != "open"
        # The node answered the handshake with 403 (a browser shows a page only 1006).
        for node in fleet:
            with pytest.raises(InvalidStatus) as refused:
                connect(
                    f"{ws_url(node)}/cells/ChatRoom/{ROOM}/ws",
                    origin=Origin(elsewhere),
                    subprotocols=[Subprotocol("cellactors.v1")],
                    open_timeout=10,
                )
            assert refused.value.response.status_code == 403
        # ... while the same page from the allowed origin connects to the same nodes.
        open_page(browser, site, "ann", list(fleet))
        shown(browser, "the allowed page to connect", is_open)
    # The room only ever saw the allowed page.
    who = httpx.post(f"{fleet[0].public_url}/cells/ChatRoom/{ROOM}/who", json={}, timeout=30)
    assert who.status_code == 200, who.text
    assert who.json()["result"] == ["ann"]
