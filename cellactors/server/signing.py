"""Signing of node-to-node requests with the 32-byte fleet key (HMAC-SHA256).

The signature covers the method, the path, sha256 of the body, the source and target node
ids, the target's process generation, a timestamp, a random nonce and the call's idempotency
key, the caller (the principal the first node authenticated) when there is one, and the
W3C ``traceparent`` of the sender's span when it traces (so a forged peer cannot graft a
call onto someone else's trace). The
receiver refuses requests that are unsigned, wrongly signed, meant for another node
or for another process of this node (an earlier or later generation: so a captured request
cannot be replayed against a restarted receiver, whose nonce cache is empty), outside the
+-30 s window, or that replay a nonce it has already seen. Everything here is pure (the
clock is a parameter) except :class:`NonceCache`, which is a small thread-safe set with
expiry.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from urllib.parse import quote

from cellactors.errors import StaleTarget, Unauthorized
from cellactors.wire.codec import IDEMPOTENCY_HEADER

SOURCE_HEADER = "X-Cellactors-Source"
TARGET_HEADER = "X-Cellactors-Target"
GENERATION_HEADER = "X-Cellactors-Target-Generation"
TIMESTAMP_HEADER = "X-Cellactors-Timestamp"
NONCE_HEADER = "X-Cellactors-Nonce"
SIGNATURE_HEADER = "X-Cellactors-Signature"
#: The originating caller (compact JSON of a principal), signed when present.
CALLER_HEADER = "X-Cellactors-Caller"
#: The W3C ``traceparent`` of the sender's span (cellactors.tracing), signed when present.
#: Not the plain ``traceparent`` header: a proxy or service mesh on the way may add or
#: rewrite that one, which would break the signature; the receiver ignores it.
TRACE_HEADER = "X-Cellactors-Traceparent"
#: Headers every signed request carries (the idempotency key is signed too, but optional).
SIGNED_HEADERS = (
    SOURCE_HEADER,
    TARGET_HEADER,
    GENERATION_HEADER,
    TIMESTAMP_HEADER,
    NONCE_HEADER,
    SIGNATURE_HEADER,
)
KEY_HEADER = IDEMPOTENCY_HEADER

SCHEME = "cellactors-hmac-v2"
DEFAULT_WINDOW = 30.0
KEY_BYTES = 32
_NONCE_RE = re.compile(r"[0-9a-f]{32}")
_NODE_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_GENERATION_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise ValueError(f"the fleet key must be {KEY_BYTES} bytes")


def string_to_sign(
    method: str,
    path: str,
    body: bytes,
    source: str,
    target: str,
    target_generation: str,
    timestamp: str,
    nonce: str,
    idempotency_key: str = "",
    caller: str = "",
    trace: str = "",
) -> bytes:
    """The canonical bytes the HMAC covers, one field per line; an absent idempotency key is
    the empty line (a present key is never empty). A caller adds one more line; an anonymous
    call has none, so its signature is what an older node computes. A trace context adds
    two, the caller's (empty when anonymous) and its own: the line count tells them apart."""
    fields: tuple[str, ...] = (
        SCHEME,
        method.upper(),
        path,
        hashlib.sha256(body).hexdigest(),
        source,
        target,
        target_generation,
        timestamp,
        nonce,
        idempotency_key,
    )
    if trace:
        fields = (*fields, caller, trace)
    elif caller:
        fields = (*fields, caller)
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
    target_generation: str,
    idempotency_key: str | None = None,
    now: float | None = None,
    nonce: str | None = None,
    caller: str = "",
    trace: str = "",
) -> dict[str, str]:
    """Headers that authenticate one request from ``source`` to the process
    ``target_generation`` of node ``target`` (from the target's lease), carrying
    ``idempotency_key`` (if any) in the signed ``Idempotency-Key`` header.

    ``path`` is the decoded request path (what the receiver's router sees), without query.
    """
    timestamp = str(int((time.time() if now is None else now) * 1000))
    nonce = secrets.token_hex(16) if nonce is None else nonce
    message = string_to_sign(
        method,
        path,
        body,
        source,
        target,
        target_generation,
        timestamp,
        nonce,
        idempotency_key or "",
        caller,
        trace,
    )
    headers = {
        SOURCE_HEADER: source,
        TARGET_HEADER: target,
        GENERATION_HEADER: target_generation,
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: compute_signature(key, message),
    }
    if idempotency_key is not None:
        headers[KEY_HEADER] = idempotency_key
    if caller:
        headers[CALLER_HEADER] = caller
    if trace:
        headers[TRACE_HEADER] = trace
    return headers


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


def operator_request(
    key: bytes,
    method: str,
    cell_id: str,
    suffix: str,
    body: bytes,
    *,
    source: str,
    target: str,
    target_generation: str,
) -> tuple[str, dict[str, str]]:
    """An operator's request on one cell of a node's internal listener
    (``/cells/{cls}/{name}{suffix}``: a purge, a rollback, dead letters): the URL path, each
    segment quoted, and the headers signed for ``target``'s process (the path signed is the
    unquoted one the listener sees)."""
    cls_name, name = cell_id.split(":", 1)
    path = f"/cells/{cls_name}/{name}{suffix}"
    url_path = "/".join(quote(part, safe="") for part in path.split("/"))
    headers = sign_request(
        key, method, path, body, source=source, target=target, target_generation=target_generation
    )
    if body:
        headers["content-type"] = "application/json"
    return url_path, headers


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.lower())
    return value


def verify_request(
    key: bytes | Sequence[bytes],
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    expected_target: str,
    expected_generation: str,
    nonces: NonceCache,
    now: float | None = None,
    window: float = DEFAULT_WINDOW,
) -> str:
    """Check a peer request signed with ``key`` (or any of several, during a rotation) and
    return its source node id, or raise :class:`Unauthorized`
    (:class:`StaleTarget` when it was signed for another process of this node).

    The ``Idempotency-Key``, caller and trace headers, when present, are covered by the signature:
    the caller reads them from the same ``headers`` after this returns. The nonce is recorded
    only after the signature has been verified, so a forger cannot fill the replay cache.
    """
    now = time.time() if now is None else now
    values = {name: _header(headers, name) for name in SIGNED_HEADERS}
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise Unauthorized(f"unsigned request: missing {', '.join(missing)}")
    source = values[SOURCE_HEADER] or ""
    target = values[TARGET_HEADER] or ""
    generation = values[GENERATION_HEADER] or ""
    idempotency_key = _header(headers, KEY_HEADER) or ""
    caller = _header(headers, CALLER_HEADER) or ""
    trace = _header(headers, TRACE_HEADER) or ""
    timestamp = values[TIMESTAMP_HEADER] or ""
    nonce = values[NONCE_HEADER] or ""
    signature = values[SIGNATURE_HEADER] or ""
    if not timestamp.isdigit() or not timestamp.isascii() or len(timestamp) > 16:
        raise Unauthorized("malformed timestamp")
    if not _NONCE_RE.fullmatch(nonce):
        raise Unauthorized("malformed nonce")
    if not _NODE_RE.fullmatch(source) or not _NODE_RE.fullmatch(target):
        raise Unauthorized("malformed node id")
    if not _GENERATION_RE.fullmatch(generation):
        raise Unauthorized("malformed target generation")
    message = string_to_sign(
        method,
        path,
        body,
        source,
        target,
        generation,
        timestamp,
        nonce,
        idempotency_key,
        caller,
        trace,
    )
    given = signature.encode("utf-8", "replace")
    matched = False
    for one in (key,) if isinstance(key, bytes) else key:  # each compared, in constant time
        expected = compute_signature(one, message).encode("ascii")
        matched = hmac.compare_digest(expected, given) or matched
    if not matched:
        raise Unauthorized("bad signature")
    if target != expected_target:
        raise Unauthorized(f"request is for node {target!r}, this is {expected_target!r}")
    if generation != expected_generation:
        raise StaleTarget(
            f"request is for process {generation!r} of node {target!r}, this is process "
            f"{expected_generation!r} (restarted since the sender looked it up)"
        )
    sent = int(timestamp) / 1000.0
    if abs(now - sent) > window:
        raise Unauthorized(f"stale request: clock is {now - sent:+.1f} s off (window {window} s)")
    if not nonces.add(nonce, sent, now):
        raise Unauthorized("replayed nonce")
    return source
