"""The fleet page of the internal listener: static files shipped in ``cellactors/server/page/``.

``GET /`` is ``index.html``; ``GET /page/<file>`` serves the scripts and style sheet. The
page itself polls ``/fleet``, ``/state``, ``/metrics`` and ``/history`` of the node that
served it, and reads the cell view from ``/inspect/cells/...`` (:mod:`.inspector`). A
strict Content-Security-Policy allows only this origin's script, style and fetches, so
nothing the page shows (node ids, cell names from the bucket) can run as code even if an
insertion were ever unescaped.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

#: The files served, with their content types; nothing else is reachable.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "inspector.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def read(name: str) -> bytes:
    """One shipped file's bytes (read once per process)."""
    return resources.files("cellactors.server").joinpath("page").joinpath(name).read_bytes()


def _answer(name: str) -> Response:
    if name not in FILES:
        raise HTTPException(404, f"no page file {name!r}")
    return Response(read(name), media_type=FILES[name], headers=HEADERS)


async def index(request: Request) -> Response:
    return _answer("index.html")


async def asset(request: Request) -> Response:
    return _answer(request.path_params["name"])


def routes() -> list[Route]:
    """The page's routes, for the internal app."""
    return [
        Route("/", index, methods=["GET"]),
        Route("/page/{name}", asset, methods=["GET"]),
    ]
