"""The baseline of row 4: a bare Starlette app on uvicorn, configured like a node's public
listener, whose one route reads and decodes the JSON body and answers fixed bytes (the same
JSON a node answered). ``python -m bench.bare_app --port P --body HEX``."""

from __future__ import annotations

import argparse
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def build_app(body: bytes) -> Starlette:
    """The app: ``POST /cells/{cls}/{name}/{method}`` answers ``body``; ``GET /healthz``."""

    async def call(request: Request) -> Response:
        json.loads(await request.body() or b"{}")
        return Response(body, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "serving"})

    return Starlette(
        routes=[
            Route("/cells/{cls_name}/{name}/{method}", call, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", required=True, help="the answer, hex-encoded")
    args = parser.parse_args()
    uvicorn.run(
        build_app(bytes.fromhex(args.body)),
        host="127.0.0.1",
        port=args.port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=75,
    )


if __name__ == "__main__":
    main()
