"""Plain S3 GETs, PUTs and listings signed here and sent on keep-alive connections,
without botocore's pipeline.

Every acknowledged batch costs one plain PUT and one plain GET, a restore reads its batches
with plain GETs after one listing, and every activation lists its cell. Through a boto3
client a GET costs about 0.6 ms of CPU (parameter validation, endpoint rules, event hooks,
response parsing) and a listing of 1,000 keys about 90 ms (mostly parsing each key's
timestamp). Signed here with AWS Signature Version 4, sent and read by
:mod:`cellactors.persistence.store.keepalive` and parsed with ElementTree, a GET costs about
0.18 ms and that listing about 20 ms. On a small machine that CPU is what limits a node's
writes, activations and restores per second.

Requests that may be sent twice take this path with a fallback: a GET, a listing, and a
plain PUT of an object whose body is fixed by its key (a batch, a snapshot). A request whose
answer is not clean (any error, timeout, unexpected status, or a body that is not whole or
not understood) is not interpreted here: the caller sends it again through boto3, which
retries, classifies the error and raises as before.

A conditional PUT is sent again only when it provably was not applied
(:meth:`DirectS3.put_conditional`): sent again after a store applied it silently, it would
be refused by its own write and read as lost. So it goes to boto3 only when it never left
(no connection, a send that failed) or when the store refused the request itself (a status
that means nothing was applied, judged by the bucket); an exchange that breaks after the
request went out raises :class:`Unanswered`, which the bucket reports as an ambiguous write.
Deletes always go through boto3. The fence gate is checked before every request, as boto3's
hook does.

It is used only against an explicit endpoint with path-style addressing (the embedded
store, SeaweedFS, MinIO, ...) and with no HTTP proxy configured: boto3 handles AWS's own
endpoints, virtual-hosted addressing and proxies.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
import re
import ssl
import threading
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from typing import Any

from cellactors.clock import StoreClock, mono
from cellactors.persistence.store.bucket import ObjectInfo, StoredObject
from cellactors.persistence.store.gate import refuse_if_fenced
from cellactors.persistence.store.keepalive import (
    ConnectionPool,
    Response,
    StaleConnection,
    Unreadable,
    WireError,
)

log = logging.getLogger(__name__)

_ALGORITHM = "AWS4-HMAC-SHA256"
_NO_SUCH_KEY = re.compile(rb"<Code>\s*NoSuchKey\s*</Code>")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class Undecided(Exception):
    """The direct request did not clearly succeed (nor clearly miss): send it through boto3."""


class Unanswered(Exception):
    """A conditional PUT left this process and no whole answer came back: the store may
    have applied it. It must not be sent again."""


@dataclass
class ListPage:
    """One page of a ListObjectsV2 answer; ``next_token`` is None on the last page."""

    objects: list[ObjectInfo] = field(default_factory=list)  # keys as the store names them
    folders: list[str] = field(default_factory=list)
    next_token: str | None = None


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class DirectS3:
    """Signs and sends GETs, plain PUTs and listings for one endpoint, region and identity.

    Idle connections wait in a pool of at most ``pool_size``: enough for every thread that
    may send at once (the upload pool's 64, restores' 16 each, activations, alarms); a
    connection beyond them is closed after its request."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        credentials: Any,
        *,
        timeout: float,
        pool_size: int = 256,
        ca_certs: str | None = None,
        clock: StoreClock | None = None,
    ) -> None:
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an HTTP endpoint: {endpoint!r}")
        self.host: str = url.netloc
        self.root = url.path.rstrip("/")
        self.region = region
        self.credentials = credentials  # botocore Credentials: refreshed by botocore
        tls = ssl.create_default_context(cafile=ca_certs) if url.scheme == "https" else None
        self.pool = ConnectionPool(
            url.hostname,
            url.port or (443 if tls else 80),
            connect_timeout=min(timeout, 5.0),
            read_timeout=timeout,
            tls=tls,
            size=pool_size,
        )
        self.clock = clock  # fed by the Date of every answer
        self._key_lock = threading.Lock()
        self._signing_key: tuple[tuple[str, str], bytes] | None = None
        #: Conditional PUTs take this path until an answer (of any request) comes back in a
        #: shape :mod:`keepalive` does not read; after that boto3 sends them, so that a store
        #: whose answers this path cannot read turns only the writes then under way
        #: ambiguous.
        self.conditional = True

    @staticmethod
    def usable(endpoint: str | None) -> bool:
        """Whether requests to ``endpoint`` may take this path: it is explicit, and no HTTP
        proxy applies to it (``NO_PROXY`` is honoured, as boto3 does)."""
        if not endpoint:
            return False
        url = urllib.parse.urlsplit(endpoint)
        if url.scheme not in urllib.request.getproxies():
            return True
        return url.hostname is not None and bool(urllib.request.proxy_bypass(url.hostname))

    # --- requests ---------------------------------------------------------------------

    def get(self, bucket: str, key: str) -> StoredObject | None:
        """The object, or None when the store says there is no such key."""
        answer = self._send("GET", self._path(bucket, key))
        etag = answer.headers.get("etag")
        if answer.status == 200:
            if etag is None:
                raise Undecided("GET answered without an ETag")
            return StoredObject(body=answer.body, token=etag)
        if answer.status == 404 and _NO_SUCH_KEY.search(answer.body):
            return None
        raise Undecided(f"GET answered {answer.status}")

    def put(self, bucket: str, key: str, body: bytes) -> str:
        """Store ``body`` under ``key``; the ETag."""
        answer = self._send("PUT", self._path(bucket, key), body=body)
        etag = answer.headers.get("etag")
        if answer.status == 200 and etag is not None:
            return etag
        raise Undecided(f"PUT answered {answer.status}")

    def list_page(
        self,
        bucket: str,
        prefix: str,
        *,
        token: str | None = None,
        delimiter: str | None = None,
        start_after: str | None = None,
        max_keys: int | None = None,
    ) -> ListPage:
        """One page of ListObjectsV2 under ``prefix``, from ``token`` (the previous page's
        ``next_token``) on."""
        params = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
        if token is not None:
            params["continuation-token"] = token
        if delimiter is not None:
            params["delimiter"] = delimiter
        if start_after:
            params["start-after"] = start_after
        if max_keys is not None:
            params["max-keys"] = str(max_keys)
        answer = self._send("GET", self.root + "/" + _quote(bucket), params)
        if answer.status != 200:
            raise Undecided(f"LIST answered {answer.status}")
        try:
            return parse_list_page(answer.body)
        except (ElementTree.ParseError, ValueError, TypeError) as err:
            raise Undecided(f"LIST answered an unreadable page: {err}") from err

    def put_conditional(
        self, bucket: str, key: str, body: bytes, condition: tuple[str, str]
    ) -> Response:
        """Send a PUT guarded by ``condition`` (``("if-none-match", "*")`` or
        ``("if-match", etag)``) at most once, and return its answer whatever its status:
        the caller judges it. :class:`Undecided` means the request never left (boto3 may
        send it); :class:`Unanswered` that it left and its fate is unknown."""
        if not self.conditional:
            raise Undecided("this store answered in a shape the direct path does not read")
        return self._send("PUT", self._path(bucket, key), body=body, condition=condition)

    # --- the wire ---------------------------------------------------------------------

    def _path(self, bucket: str, key: str) -> str:
        return self.root + "/" + _quote(bucket) + "/" + _quote(key)

    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None = None,
        body: bytes = b"",
        condition: tuple[str, str] | None = None,
    ) -> Response:
        """Send one request on a pooled connection and read its whole answer. A pooled
        connection the store closed while it was idle fails before any answer arrives:
        then the idle ones are dropped and the request is sent once more on a new one. A
        conditional request (``condition``) is sent again only if it never left: it skips
        idle connections already seen closed, and any failure after its send is
        :class:`Unanswered`."""
        query = _canonical_query(params) if params else ""
        target = path + ("?" + query if query else "")
        try:
            headers = self._signed(method, path, query, body, condition)
            if method == "PUT":
                headers["content-length"] = str(len(body))
            head = f"{method} {target} HTTP/1.1\r\n" + "".join(
                f"{name}: {value}\r\n" for name, value in headers.items()
            )
            request = (head + "\r\n").encode("ascii") + body
        except Exception as err:  # credentials that failed to refresh, a non-ASCII header:
            # boto3 sends it instead and raises its own, classified error
            raise Undecided(f"{method} could not be signed: {err}") from err
        for attempt in (1, 2):
            refuse_if_fenced()  # raises Fenced: the gate is closed, nothing is sent
            pooled = False
            try:
                conn, pooled = self.pool.take()
                if pooled and condition is not None and conn.looks_closed():
                    conn.close()
                    self.pool.close()
                    pooled = False
                    conn = self.pool.connect()
                sent = mono()
                answer = conn.exchange(request)
            except WireError as err:
                if isinstance(err, Unreadable) and self.conditional:
                    self.conditional = False
                    log.warning(
                        "the store at %s answered %s: conditional PUTs go through boto3 from "
                        "now on",
                        self.host,
                        err,
                    )
                if condition is not None and err.sent:
                    raise Unanswered(f"{method} sent, then {err}") from err
                if pooled and attempt == 1 and (isinstance(err, StaleConnection) or not err.sent):
                    self.pool.close()
                    continue
                raise Undecided(f"{method} failed: {err}") from err
            self.pool.give(conn)
            if self.clock is not None:
                self.clock.observe(sent, mono(), answer.headers.get("date"))
            return answer
        raise AssertionError("unreachable")

    def _signed(
        self,
        method: str,
        path: str,
        query: str,
        body: bytes,
        condition: tuple[str, str] | None = None,
    ) -> dict[str, str]:
        """The request's headers with its Signature Version 4 authorization (a condition
        header is signed with them)."""
        creds = self.credentials.get_frozen_credentials()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        payload = hashlib.sha256(body).hexdigest() if body else _EMPTY_SHA256
        headers: dict[str, str] = {
            "host": self.host,
            "x-amz-content-sha256": payload,
            "x-amz-date": stamp,
        }
        if creds.token:
            headers["x-amz-security-token"] = creds.token
        if condition is not None:
            headers[condition[0]] = condition[1]
        names = sorted(headers)
        canonical = "\n".join(
            (
                method,
                path,
                query,
                "".join(f"{name}:{headers[name]}\n" for name in names),
                ";".join(names),
                payload,
            )
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            (_ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest())
        )
        signature = hmac.new(
            self._key_for(day, creds.secret_key), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        headers["Authorization"] = (
            f"{_ALGORITHM} Credential={creds.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        )
        return headers  # with the Host signed, as the request's only Host header

    def _key_for(self, day: str, secret: str) -> bytes:
        """The signing key of ``day`` (derived once a day per secret)."""
        with self._key_lock:
            cached = self._signing_key
            if cached is not None and cached[0] == (day, secret):
                return cached[1]
            key = _hmac(("AWS4" + secret).encode(), day)
            for part in (self.region, "s3", "aws4_request"):
                key = _hmac(key, part)
            self._signing_key = ((day, secret), key)
            return key


def _quote(text: str) -> str:
    """URI-encode a path part as Signature Version 4 wants it for S3 (``/`` kept)."""
    return urllib.parse.quote(text, safe="/~")


def _canonical_query(params: dict[str, str]) -> str:
    """The query string, names sorted and every name and value URI-encoded, as Signature
    Version 4 signs it (the same string is sent)."""
    return "&".join(
        f"{urllib.parse.quote(name, safe='~')}={urllib.parse.quote(value, safe='~')}"
        for name, value in sorted(params.items())
    )


def parse_list_page(body: bytes) -> ListPage:
    """A ListObjectsV2 answer's objects, folders and continuation. Raises ValueError on
    anything it does not recognise, so that the page is listed again through boto3."""
    root = ElementTree.fromstring(body)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    if root.tag != ns + "ListBucketResult":
        raise ValueError(f"not a listing: {root.tag}")

    def text(node: ElementTree.Element, name: str) -> str | None:
        found = node.find(ns + name)
        return None if found is None else (found.text or "")

    encoded = text(root, "EncodingType") == "url"

    def name(value: str | None) -> str:
        if value is None:
            raise ValueError("a listed entry has no name")
        return urllib.parse.unquote_plus(value) if encoded else value

    page = ListPage()
    for item in root.iterfind(ns + "Contents"):
        page.objects.append(
            ObjectInfo(
                key=name(text(item, "Key")),
                token=text(item, "ETag") or "",
                size=int(text(item, "Size") or 0),
                last_modified_ms=_timestamp_ms(text(item, "LastModified")),
            )
        )
    for folder in root.iterfind(ns + "CommonPrefixes"):
        page.folders.append(name(text(folder, "Prefix")))
    if text(root, "IsTruncated") == "true":
        page.next_token = text(root, "NextContinuationToken")
        if not page.next_token:
            raise ValueError("a truncated listing without a continuation token")
    return page


def _timestamp_ms(value: str | None) -> int:
    """Milliseconds since the epoch of an ISO 8601 UTC time as S3 lists it
    (``2026-12-01T12:00:00.000Z``)."""
    if not value or not value.endswith("Z"):
        raise ValueError(f"unexpected LastModified {value!r}")
    when = datetime.datetime.fromisoformat(value[:-1] + "+00:00")
    return int(when.timestamp() * 1000)
