"""The ``/docs`` page of the public listener: Swagger UI rendering the node's own
``/openapi.json``, from files shipped in ``cellactors/server/api_docs/`` (Swagger UI is
vendored there, with its license, see its ``VENDORED.md``).

``GET /docs`` is the page; ``GET /docs/<file>`` its script and style sheets, nothing else.
The page fetches nothing from any other origin, and its Content-Security-Policy says so to
the browser: scripts, styles, fetches and fonts from this origin only (images also as
``data:`` URLs, which Swagger UI's style sheet draws its icons with). Like the document, the
page is public on every node: it holds no secret, and a call made from it ("Try it out")
needs the same credential as any other.
"""

from __future__ import annotations

import gzip
from functools import cache
from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

_JS = "text/javascript; charset=utf-8"
_CSS = "text/css; charset=utf-8"
#: The files served under ``/docs/``, with their place and content type.
FILES: dict[str, tuple[str, str]] = {
    "docs.js": ("docs.js", _JS),
    "docs.css": ("docs.css", _CSS),
    "swagger-ui-bundle.js": ("swagger-ui/swagger-ui-bundle.js", _JS),
    "swagger-ui.css": ("swagger-ui/swagger-ui.css", _CSS),
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; font-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
#: Swagger UI's files change only with cellactors; the page and its start-up script are
#: asked again every time (a new version names its files the same way).
_CACHE = {"vendored": "public, max-age=3600", "own": "no-cache"}


@cache
def read(path: str) -> bytes:
    """One shipped file's bytes (read once per process)."""
    return resources.files("cellactors.server").joinpath("api_docs").joinpath(path).read_bytes()


@cache
def _gzipped(path: str) -> bytes:
    return gzip.compress(read(path), compresslevel=6, mtime=0)


def _answer(request: Request, path: str, media_type: str) -> Response:
    headers = dict(HEADERS)
    headers["Cache-Control"] = _CACHE["vendored" if path.startswith("swagger-ui/") else "own"]
    headers["Vary"] = "Accept-Encoding"
    # Swagger UI is 1.7 MB, a quarter of it gzipped: compressed once, for every browser.
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"
        return Response(_gzipped(path), media_type=media_type, headers=headers)
    return Response(read(path), media_type=media_type, headers=headers)


async def page(request: Request) -> Response:
    return _answer(request, "index.html", "text/html; charset=utf-8")


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in FILES:
        raise HTTPException(404, f"no docs file {name!r}")
    path, media_type = FILES[name]
    return _answer(request, path, media_type)


def routes() -> list[Route]:
    """The page's routes, for the public app."""
    return [
        Route("/docs", page, methods=["GET"]),
        Route("/docs/{name}", asset, methods=["GET"]),
    ]
