"""A small S3-dialect HTTP server for tests, with modes that misbehave on purpose.

Threaded, loopback, port 0, path-style addressing; just enough of PUT/GET/HEAD/DELETE
object, ListObjectsV2 and CreateBucket/HeadBucket for boto3. ETag = quoted md5 of the body.

Modes (they change conditional PUTs only; plain requests always behave):

- ``enforce``: honours ``If-None-Match: *`` and ``If-Match`` atomically (either ETag
  spelling matches; If-Match on a missing key answers 404 NoSuchKey, as AWS does).
- ``ignore``: accepts the conditional headers and never enforces them: every PUT succeeds.
- ``error500``: conditional PUTs answer 500 InternalError and write nothing.
- ``drop_after_commit``: evaluates and commits a conditional PUT, then closes the
  connection without answering.
- ``unquoted_only``: ``If-Match`` matches only the bare ETag, never the quoted one.
- ``conflict409``: conditional PUTs answer 409 ConditionalRequestConflict, write nothing.

Every request is recorded in :attr:`FakeS3.requests` so tests can count them.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

MODES = ("enforce", "ignore", "error500", "drop_after_commit", "unquoted_only", "conflict409")


@dataclass(frozen=True)
class StoredBody:
    body: bytes
    etag: str  # quoted
    modified: float


@dataclass(frozen=True)
class RequestRecord:
    """One request as the fake saw it (``key`` is empty for bucket-level requests)."""

    method: str
    bucket: str
    key: str
    if_match: str | None
    if_none_match: str | None
    status: int  # 0 when the connection was dropped without an answer
    access_key: str = ""  # from the SigV4 Authorization header
    region: str = ""

    @property
    def conditional(self) -> bool:
        return self.if_match is not None or self.if_none_match is not None


def etag_of(body: bytes) -> str:
    return '"' + hashlib.md5(body).hexdigest() + '"'


class FakeS3:
    """The store behind the HTTP server: buckets of objects, one lock for atomic CAS."""

    def __init__(self, mode: str = "enforce") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        self.mode = mode
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, StoredBody]] = {}
        self.requests: list[RequestRecord] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    def record(self, rec: RequestRecord) -> None:
        with self.lock:
            self.requests.append(rec)

    def puts(self, key: str) -> list[RequestRecord]:
        """Every PUT of object ``key`` seen so far."""
        with self.lock:
            return [r for r in self.requests if r.method == "PUT" and r.key == key]

    def create_bucket(self, bucket: str) -> str:
        """Create ``bucket`` directly (no request recorded) and return its name."""
        with self.lock:
            self.buckets.setdefault(bucket, {})
        return bucket

    def objects(self, bucket: str) -> dict[str, bytes]:
        with self.lock:
            return {k: v.body for k, v in self.buckets.get(bucket, {}).items()}

    def start(self) -> FakeS3:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.fake = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-s3", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)


@contextmanager
def running_fake(mode: str = "enforce") -> Iterator[FakeS3]:
    """A started :class:`FakeS3`, stopped on exit."""
    fake = FakeS3(mode).start()
    try:
        yield fake
    finally:
        fake.stop()


def _error_xml(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f"<Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
    ).encode()


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeS3/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    @property
    def fake(self) -> FakeS3:
        return self.server.fake  # type: ignore[attr-defined,no-any-return]

    # ---- plumbing

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        bucket, _, key = parts.path.lstrip("/").partition("/")
        return unquote(bucket), unquote(key), parse_qs(parts.query)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        head_only: bool = False,
        content_length: int | None = None,
    ) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if body and "Content-Type" not in (headers or {}):
            self.send_header("Content-Type", "application/xml")
        self.send_header(
            "Content-Length", str(len(body) if content_length is None else content_length)
        )
        self.end_headers()
        if not head_only and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head_only: bool = False) -> None:
        self._send(status, b"" if head_only else _error_xml(code, message))

    def _log(self, bucket: str, key: str, status: int) -> None:
        # "AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/s3/aws4_request, ..."
        auth = self.headers.get("Authorization", "")
        scope = auth.partition("Credential=")[2].partition(",")[0].split("/")
        self.fake.record(
            RequestRecord(
                self.command,
                bucket,
                key,
                self.headers.get("If-Match"),
                self.headers.get("If-None-Match"),
                status,
                scope[0] if len(scope) > 2 else "",
                scope[2] if len(scope) > 2 else "",
            )
        )

    # ---- verbs

    def do_PUT(self) -> None:
        bucket, key, _ = self._target()
        body = self._read_body()
        fake = self.fake
        if not key:
            with fake.lock:
                fake.buckets.setdefault(bucket, {})
            self._log(bucket, key, 200)
            self._send(200, headers={"Location": f"/{bucket}"})
            return
        if_match = self.headers.get("If-Match")
        if_none_match = self.headers.get("If-None-Match")
        conditional = if_match is not None or if_none_match is not None
        mode = fake.mode
        if conditional and mode == "error500":
            self._log(bucket, key, 500)
            self._error(500, "InternalError", "We encountered an internal error.")
            return
        if conditional and mode == "conflict409":
            self._log(bucket, key, 409)
            self._error(409, "ConditionalRequestConflict", "A conflicting operation occurred.")
            return
        etag = etag_of(body)
        with fake.lock:
            objects = fake.buckets.get(bucket)
            if objects is None:
                status, code = 404, "NoSuchBucket"
            else:
                status, code = self._check(objects.get(key), if_match, if_none_match, mode)
                if status == 200:
                    objects[key] = StoredBody(body, etag, time.time())
        if conditional and mode == "drop_after_commit":
            self._log(bucket, key, 0)
            self.close_connection = True
            return  # no answer at all: the handler closes the socket
        self._log(bucket, key, status)
        if status == 200:
            self._send(200, headers={"ETag": etag})
        else:
            self._error(status, code, f"{code} for {key}")

    @staticmethod
    def _check(
        current: StoredBody | None, if_match: str | None, if_none_match: str | None, mode: str
    ) -> tuple[int, str]:
        """Evaluate the preconditions the way ``mode`` does; (200, "") means write."""
        if mode == "ignore":
            return 200, ""
        if if_none_match is not None and if_none_match.strip() == "*" and current is not None:
            return 412, "PreconditionFailed"
        if if_match is not None:
            if current is None:
                return 404, "NoSuchKey"
            wanted = if_match.strip()
            bare = current.etag.strip('"')
            accepted = (bare,) if mode == "unquoted_only" else (current.etag, bare, "*")
            if wanted not in accepted:
                return 412, "PreconditionFailed"
        return 200, ""

    def do_GET(self) -> None:
        bucket, key, query = self._target()
        fake = self.fake
        with fake.lock:
            objects = fake.buckets.get(bucket)
            snapshot = dict(objects) if objects is not None else None
        if snapshot is None:
            self._log(bucket, key, 404)
            self._error(404, "NoSuchBucket", f"no bucket {bucket}")
            return
        if not key:
            self._log(bucket, key, 200)
            self._send(200, self._list_xml(bucket, snapshot, query))
            return
        obj = snapshot.get(key)
        if obj is None:
            self._log(bucket, key, 404)
            self._error(404, "NoSuchKey", f"no key {key}")
            return
        self._log(bucket, key, 200)
        self._send(200, obj.body, self._object_headers(obj))

    def do_HEAD(self) -> None:
        bucket, key, _ = self._target()
        fake = self.fake
        with fake.lock:
            objects = fake.buckets.get(bucket)
            obj = objects.get(key) if objects is not None and key else None
        if objects is None or (key and obj is None):
            self._log(bucket, key, 404)
            self._send(404, head_only=True)
            return
        self._log(bucket, key, 200)
        if obj is None:
            self._send(200, head_only=True)
            return
        self._send(
            200, obj.body, self._object_headers(obj), head_only=True, content_length=len(obj.body)
        )

    def do_DELETE(self) -> None:
        bucket, key, _ = self._target()
        fake = self.fake
        with fake.lock:
            objects = fake.buckets.get(bucket)
            if objects is not None:
                objects.pop(key, None)
        self._log(bucket, key, 204 if objects is not None else 404)
        if objects is None:
            self._error(404, "NoSuchBucket", f"no bucket {bucket}")
        else:
            self._send(204)

    # ---- helpers

    @staticmethod
    def _object_headers(obj: StoredBody) -> dict[str, str]:
        return {
            "ETag": obj.etag,
            "Last-Modified": formatdate(obj.modified, usegmt=True),
            "Content-Type": "application/octet-stream",
        }

    @staticmethod
    def _list_xml(
        bucket: str, objects: dict[str, StoredBody], query: dict[str, list[str]]
    ) -> bytes:
        prefix = query.get("prefix", [""])[0]
        keys = sorted(k for k in objects if k.startswith(prefix))
        contents = "".join(
            f"<Contents><Key>{escape(k)}</Key><LastModified>{_iso(objects[k].modified)}"
            f"</LastModified><ETag>{escape(objects[k].etag)}</ETag>"
            f"<Size>{len(objects[k].body)}</Size><StorageClass>STANDARD</StorageClass></Contents>"
            for k in keys
        )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(keys)}</KeyCount><MaxKeys>100000</MaxKeys>"
            f"<IsTruncated>false</IsTruncated>{contents}</ListBucketResult>"
        ).encode()
