"""Signing of node-to-node requests with the 32-byte fleet key (HMAC-SHA256).

The signature covers the method, the path, sha256 of the body, the source and target node
ids, a timestamp and a random nonce. The receiver refuses requests that are unsigned,
wrongly signed, meant for another node, outside the +-30 s window, or that replay a nonce it
has already seen. Everything here is pure (the clock is a parameter) except
:class:`NonceCache`, which is a small thread-safe set with expiry.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import threading
import time
from collections.abc import Mapping

from cellactors.errors import NOT_RUN, CallError

SOURCE_HEADER = "X-Cellactors-Source"
TARGET_HEADER = "X-Cellactors-Target"
TIMESTAMP_HEADER = "X-Cellactors-Timestamp"
NONCE_HEADER = "X-Cellactors-Nonce"
SIGNATURE_HEADER = "X-Cellactors-Signature"
SIGNED_HEADERS = (SOURCE_HEADER, TARGET_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)

SCHEME = "cellactors-hmac-v1"
DEFAULT_WINDOW = 30.0
KEY_BYTES = 32
_NONCE_RE = re.compile(r"^[0-9a-f]{32}$")
_NODE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class Unauthorized(CallError):
    """A peer request failed signature verification; it was not executed."""

    status = 401
    code = "unauthorized"
    outcome = NOT_RUN


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"the fleet key must be {KEY_BYTES} bytes")


def string_to_sign(
    method: str, path: str, body: bytes, source: str, target: str, timestamp: str, nonce: str
) -> bytes:
    """The canonical bytes the HMAC covers, one field per line."""
    fields = (
        SCHEME,
        method.upper(),
        path,
        hashlib.sha256(body).hexdigest(),
        source,
        target,
        timestamp,
        nonce,
    )
    return "\n".join(fields).encode("utf-8")


def compute_signature(key: bytes, message: bytes) -> str:
    """Hex HMAC-SHA256 of ``message`` under ``key``."""
    _check_key(key)
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_request(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    *,
    source: str,
    target: str,
    now: float | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Headers that authenticate one request from ``source`` to ``target``.

    ``path`` is the decoded request path (what the receiver's router sees), without query.
    """
    timestamp = str(int((time.time() if now is None else now) * 1000))
    nonce = secrets.token_hex(16) if nonce is None else nonce
    message = string_to_sign(method, path, body, source, target, timestamp, nonce)
    return {
        SOURCE_HEADER: source,
        TARGET_HEADER: target,
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: compute_signature(key, message),
    }


class NonceCache:
    """Nonces seen within the replay window, bounded in size.

    A nonce is remembered until its timestamp leaves the window; older ones are forgotten
    (their requests are refused as stale anyway). When the cache is full the entry expiring
    soonest is evicted and becomes a floor: any nonce that would expire no later than it is
    refused, so eviction can never let a replay through (it can only refuse a little early).
    """

    def __init__(self, window: float = DEFAULT_WINDOW, max_entries: int = 100_000) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.window = window
        self.max_entries = max_entries
        self._expiry: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._floor = float("-inf")
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._expiry)

    def add(self, nonce: str, timestamp: float, now: float) -> bool:
        """Record ``nonce`` (sent at ``timestamp``); False if it was seen before or may have
        been."""
        expires = timestamp + self.window
        with self._lock:
            self._prune(now)
            if nonce in self._expiry or expires <= self._floor:
                return False
            while len(self._expiry) >= self.max_entries:
                old_expires, old = heapq.heappop(self._heap)
                del self._expiry[old]
                self._floor = max(self._floor, old_expires)
                if expires <= self._floor:
                    return False
            self._expiry[nonce] = expires
            heapq.heappush(self._heap, (expires, nonce))
            return True

    def _prune(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now:
            _, old = heapq.heappop(self._heap)
            del self._expiry[old]


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value


def verify_request(
    key: bytes,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    expected_target: str,
    nonces: NonceCache,
    now: float | None = None,
    window: float = DEFAULT_WINDOW,
) -> str:
    """Check a peer request and return its source node id, or raise :class:`Unauthorized`.

    The nonce is recorded only after the signature has been verified, so a forger cannot
    fill the replay cache.
    """
    now = time.time() if now is None else now
    values = {name: _header(headers, name) for name in SIGNED_HEADERS}
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise Unauthorized(f"unsigned request: missing {', '.join(missing)}")
    source = values[SOURCE_HEADER] or ""
    target = values[TARGET_HEADER] or ""
    timestamp = values[TIMESTAMP_HEADER] or ""
    nonce = values[NONCE_HEADER] or ""
    signature = values[SIGNATURE_HEADER] or ""
    if not timestamp.isdigit() or len(timestamp) > 16:
        raise Unauthorized("malformed timestamp")
    if not _NONCE_RE.match(nonce):
        raise Unauthorized("malformed nonce")
    if not _NODE_RE.match(source) or not _NODE_RE.match(target):
        raise Unauthorized("malformed node id")
    expected = compute_signature(
        key, string_to_sign(method, path, body, source, target, timestamp, nonce)
    )
    if not hmac.compare_digest(expected.encode("ascii"), signature.encode("utf-8", "replace")):
        raise Unauthorized("bad signature")
    if target != expected_target:
        raise Unauthorized(f"request is for node {target!r}, this is {expected_target!r}")
    sent = int(timestamp) / 1000.0
    if abs(now - sent) > window:
        raise Unauthorized(f"stale request: clock is {now - sent:+.1f} s off (window {window} s)")
    if not nonces.add(nonce, sent, now):
        raise Unauthorized("replayed nonce")
    return source
