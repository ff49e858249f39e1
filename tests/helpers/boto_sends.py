"""Counting the requests boto3 really sends (to tell the direct S3 path from boto3)."""

from __future__ import annotations

from typing import Any


class BotoSends:
    """Counts the HTTP requests boto3 sends through one client (its before-send event)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.count = 0

    def __call__(self, **_kwargs: Any) -> None:
        self.count += 1

    def __enter__(self) -> BotoSends:
        self.client.meta.events.register("before-send.s3", self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.meta.events.unregister("before-send.s3", self)


OK_HEAD = b'HTTP/1.1 200 OK\r\nETag: "e"\r\n'
