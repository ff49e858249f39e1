"""Plain S3 GETs and PUTs signed here and sent with urllib3, without botocore's pipeline.

Every acknowledged batch costs one plain PUT and one plain GET, and a restore reads its
batches with plain GETs. Through a boto3 client each of those costs about 1.2 ms of CPU
(parameter validation, endpoint rules, event hooks, response parsing); signed here with
AWS Signature Version 4 and sent on a urllib3 pool, about 0.5 ms. On a small machine that
CPU is what limits a node's writes per second.

Only requests that may be sent twice take this path: a GET, and a plain PUT of an object
whose body is fixed by its key (a batch, a snapshot). A request that fails in any way is
not interpreted here: the caller sends it again through boto3, which retries, classifies
the error and raises as before. Conditional writes, listings and deletes always go through
boto3. The fence gate is checked before every request, as boto3's hook does.

It is used only against an explicit endpoint with path-style addressing (the embedded
store, SeaweedFS, MinIO, ...) and with no HTTP proxy configured: boto3 handles AWS's own
endpoints, virtual-hosted addressing and proxies.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import threading
import urllib.parse
import urllib.request
from typing import Any

import urllib3

from cellactors.persistence.bucket import StoredObject
from cellactors.persistence.gate import refuse_if_fenced

_ALGORITHM = "AWS4-HMAC-SHA256"
_NO_SUCH_KEY = re.compile(rb"<Code>\s*NoSuchKey\s*</Code>")


class Undecided(Exception):
    """The direct request did not clearly succeed (nor clearly miss): send it through boto3."""


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


class DirectS3:
    """Signs and sends GET and plain PUT requests for one endpoint, region and identity.

    ``pool_size`` connections are kept: enough for every thread that may send at once (the
    upload pool's 64, restores' 16 each, activations, alarms); a request beyond them opens
    a connection it closes afterwards (and urllib3 logs a warning)."""

    def __init__(
        self,
        endpoint: str,
        region: str,
        credentials: Any,
        *,
        timeout: float,
        pool_size: int = 256,
        ca_certs: str | None = None,
    ) -> None:
        url = urllib3.util.parse_url(endpoint)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"not an HTTP endpoint: {endpoint!r}")
        self.base = f"{url.scheme}://{url.netloc}"
        self.root = (url.path or "").rstrip("/")
        self.host: str = url.netloc or url.host
        self.region = region
        self.credentials = credentials  # botocore Credentials: refreshed by botocore
        self.timeout = urllib3.Timeout(connect=min(timeout, 5.0), read=timeout)
        kwargs: dict[str, Any] = {"maxsize": pool_size, "block": False, "retries": False}
        if url.scheme == "https" and ca_certs:
            kwargs["ca_certs"] = ca_certs
        self.pool = urllib3.PoolManager(**kwargs)
        self._key_lock = threading.Lock()
        self._signing_key: tuple[tuple[str, str], bytes] | None = None

    @staticmethod
    def usable(endpoint: str | None) -> bool:
        """Whether requests to ``endpoint`` may take this path: it is explicit, and no HTTP
        proxy applies to it (``NO_PROXY`` is honoured, as boto3 does)."""
        if not endpoint:
            return False
        url = urllib3.util.parse_url(endpoint)
        if url.scheme not in urllib.request.getproxies():
            return True
        return url.host is not None and bool(urllib.request.proxy_bypass(url.host))

    def get(self, bucket: str, key: str) -> StoredObject | None:
        """The object, or None when the store says there is no such key."""
        resp = self._send("GET", bucket, key, b"")
        if resp.status == 200:
            etag = resp.headers.get("ETag")
            if etag is None:
                raise Undecided("GET answered without an ETag")
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) != len(resp.data):
                # A body cut short (urllib3 1.x does not check) must never be taken for the
                # object: a short batch would read as a torn one.
                raise Undecided(f"GET answered {len(resp.data)} of {length} bytes")
            return StoredObject(body=resp.data, token=str(etag))
        if resp.status == 404 and _NO_SUCH_KEY.search(resp.data or b""):
            return None
        raise Undecided(f"GET answered {resp.status}")

    def put(self, bucket: str, key: str, body: bytes) -> str:
        """Store ``body`` under ``key``; the ETag."""
        resp = self._send("PUT", bucket, key, body)
        etag = resp.headers.get("ETag")
        if resp.status == 200 and etag is not None:
            return str(etag)
        raise Undecided(f"PUT answered {resp.status}")

    def _send(self, method: str, bucket: str, key: str, body: bytes) -> Any:
        refuse_if_fenced()  # raises Fenced: the gate is closed, nothing is sent
        path = self.root + "/" + _quote(bucket) + "/" + _quote(key)
        try:
            headers = self._signed(method, path, body)
            return self.pool.request(
                method,
                self.base + path,
                body=body if method == "PUT" else None,
                headers=headers,
                timeout=self.timeout,
                retries=False,
                redirect=False,
                preload_content=True,
            )
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            raise Undecided(f"{method} failed: {err}") from err

    def _signed(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """The request's headers with its Signature Version 4 authorization."""
        creds = self.credentials.get_frozen_credentials()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        day = stamp[:8]
        payload = hashlib.sha256(body).hexdigest()
        headers: dict[str, str] = {
            "host": self.host,
            "x-amz-content-sha256": payload,
            "x-amz-date": stamp,
        }
        if creds.token:
            headers["x-amz-security-token"] = creds.token
        names = sorted(headers)
        canonical = "\n".join(
            (
                method,
                path,
                "",
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
        return headers  # with the Host signed, so that urllib3 sends that one

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
