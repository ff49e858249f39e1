"""The baseline of rows 4 and 15: a bare Starlette app on uvicorn, configured like a node's
public listener, whose one route reads and decodes the JSON body and answers fixed bytes (the
same JSON a node answered), and whose WebSocket route echoes each frame (after a hello frame
like a node's, for a client asking for ``cellactors.v1``), served by the node's WebSocket
implementation with its settings. ``python -m bench.bare_app --port P --body HEX``."""

from __future__ import annotations

import argparse
import json
import resource
import secrets

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

SUBPROTOCOL = "cellactors.v1"


def build_app(body: bytes) -> Starlette:
    """The app: ``POST /cells/{cls}/{name}/{method}`` answers ``body``; ``GET /healthz``."""

    async def call(request: Request) -> Response:
        json.loads(await request.body() or b"{}")
        return Response(body, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "serving"})

    async def echo(ws: WebSocket) -> None:
        numbered = SUBPROTOCOL in ws.scope.get("subprotocols", ())
        await ws.accept(subprotocol=SUBPROTOCOL if numbered else None)
        if numbered:
            await ws.send_text(json.dumps({"conn": secrets.token_urlsafe(16), "seq": 0}))
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is not None:
                    await ws.send_text(message["text"])
                elif message.get("bytes") is not None:
                    await ws.send_bytes(message["bytes"])
        except WebSocketDisconnect:
            return

    return Starlette(
        routes=[
            Route("/cells/{cls_name}/{name}/{method}", call, methods=["POST"]),
            Route("/healthz", healthz, methods=["GET"]),
            WebSocketRoute("/cells/{cls_name}/{name}/ws", echo),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", required=True, help="the answer, hex-encoded")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # like a node: as many sockets as the hard limit allows
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    uvicorn.run(
        build_app(bytes.fromhex(args.body)),
        host="127.0.0.1",
        port=args.port,
        log_config=None,
        access_log=False,
        timeout_keep_alive=75,
        # A node's public listener's WebSocket settings (cellactors.server.runner).
        ws="websockets-sansio",
        ws_max_size=1 << 20,
        ws_per_message_deflate=False,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
    )


if __name__ == "__main__":
    main()
