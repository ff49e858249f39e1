"""The ``/docs`` page of the public listener, over HTTP: Swagger UI served by the node
itself, every file the page names on the same origin and served, a Content-Security-Policy
that allows nothing from anywhere else, and the page public on a node that authenticates
(as ``/openapi.json`` is). ``tests/browser/test_docs_page.py`` renders it in Chromium."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from cellactors.persistence.store.s3 import S3Bucket
from cellactors.server import docs_page
from cellactors.server.app import ServerSettings
from cellactors.server.auth import ApiKeys, Authentication
from tests.helpers.served import ServedNode, served_node

KEYS = {"ak_user_0123456789abcdef01": {"principal": "ann", "roles": ["user"]}}


class _Refs(HTMLParser):
    """Every URL an HTML page names (``src``, ``href``, ``action``...)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "action", "srcset") and v]


@pytest.fixture
def guarded(sw_bucket: S3Bucket, tmp_path: Path) -> Iterator[ServedNode]:
    """A node that authenticates every call: the page must still be public."""
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    settings = ServerSettings(authentication=Authentication([ApiKeys(path)]))
    with served_node(sw_bucket, "n1", settings) as node:
        yield node


def test_the_page_and_everything_it_names_are_served_from_the_node_only(
    guarded: ServedNode,
) -> None:
    with httpx.Client(timeout=30) as http:  # no credential
        page_url = f"{guarded.public}/docs"
        page = http.get(page_url)
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self';" in csp
        assert "frame-ancestors 'none'" in csp
        assert "unsafe" not in csp and "http" not in csp and "*" not in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        refs = _Refs()
        refs.feed(page.text)
        assert len(refs.urls) >= 5, refs.urls  # 2 style sheets, 2 scripts, openapi.json
        origin = urlsplit(guarded.public).netloc
        for ref in refs.urls:
            url = urljoin(page_url, ref)
            assert urlsplit(url).netloc == origin, ref  # relative: this node
            answer = http.get(url)
            assert answer.status_code == 200, (ref, answer.text)
            if ref.endswith(".js"):
                assert answer.headers["content-type"].startswith("text/javascript"), ref
                assert answer.headers["content-security-policy"] == csp
            elif ref.endswith(".css"):
                assert answer.headers["content-type"].startswith("text/css"), ref
                # The style sheets draw with data: URLs only, never a file elsewhere.
                sources = re.findall(r"url\(\s*[\"']?([^\"')]*)", answer.text)
                assert all(s.startswith("data:") for s in sources), sources[:3]
                assert "@import" not in answer.text and "@font-face" not in answer.text
        start = http.get(urljoin(page_url, "docs/docs.js")).text
        assert 'new URL("openapi.json", document.baseURI)' in start
        assert "validatorUrl: null" in start  # no document sent to a public validator
        assert "queryConfigEnabled: false" in start  # no ?url= of another document
        bundle = http.get(urljoin(page_url, "docs/swagger-ui-bundle.js")).text
        assert "SwaggerUIBundle" in bundle and "sourceMappingURL" not in bundle[-200:]


def test_swagger_ui_is_sent_gzipped_to_who_takes_it(guarded: ServedNode) -> None:
    url = f"{guarded.public}/docs/swagger-ui-bundle.js"
    shipped = docs_page.read("swagger-ui/swagger-ui-bundle.js")
    with httpx.Client(timeout=30) as http:
        raw = http.get(url, headers={"accept-encoding": "identity"})
        assert raw.content == shipped and "content-encoding" not in raw.headers
        with http.stream("GET", url, headers={"accept-encoding": "gzip"}) as zipped:
            assert zipped.headers["content-encoding"] == "gzip"
            body = b"".join(zipped.iter_raw())
        assert gzip.decompress(body) == shipped and len(body) < len(shipped) / 2
        assert raw.headers["vary"] == "Accept-Encoding"


def test_only_the_page_files_are_served(guarded: ServedNode) -> None:
    with httpx.Client(timeout=30) as http:
        for name in ("LICENSE", "index.html", "..%2Fdocs_page.py", "swagger-ui.css.map"):
            answer = http.get(f"{guarded.public}/docs/{name}")
            assert answer.status_code == 404, name
            assert answer.json()["error"] == "not_found"
        # The document the page renders is public too.
        assert http.get(f"{guarded.public}/openapi.json").status_code == 200


def test_the_license_of_swagger_ui_ships_beside_it() -> None:
    vendored = Path(docs_page.__file__).parent / "api_docs" / "swagger-ui"
    assert "Apache License" in (vendored / "LICENSE").read_text()
    assert "SmartBear" in (vendored / "NOTICE").read_text()
    assert "swagger-ui-dist" in (vendored / "VENDORED.md").read_text()
