"""``FaultProxy``: an S3 reverse proxy that injects store faults for one node.

It sits between one ``cellactors serve`` process (``--endpoint`` points at the proxy) and a
real SeaweedFS. Requests are forwarded byte for byte (Host and every signed header kept, so
SigV4 still verifies); each is classified into a *kind* (the key classes of
:func:`cellactors.persistence.store.metered.key_kind`, plus ``list`` and ``delete``) and matched
against rules the test adds and removes at run time. A rule applies one action:

- :class:`Delay`: wait, then forward;
- :class:`Fail`: answer an S3 XML error (503, 500, ...) without forwarding;
- :class:`Spurious412`: answer ``412 PreconditionFailed`` without forwarding;
- :class:`Hang`: hold without forwarding until the rule's gate is released or the proxy
  stops, then close the connection without an answer (a request lost in the network);
- :class:`ApplyThenDrop`: forward (so the store applies it), then close the connection
  without an answer (an ambiguous write);
- :class:`Hold`: hold until the gate is released, *then* forward and answer (a write that
  lands late); :attr:`Rule.arrived` tells the test a request is being held;
- :class:`ClockOffset`: forward, but rewrite the ``Date`` answer header as if the store's
  clock were off by that many seconds;
- :class:`LagListings`: forward a listing, but leave out of its answer every object the store
  says was modified within the last that many seconds (a store whose listings lag).

Every request is logged (:class:`Request`) with its arrival and answer times, kind, method,
key, statuses, the action applied and, for ``own.json`` PUTs, the body, so a checker can
rebuild who wrote which ownership epoch.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import http.client
import http.server
import json
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

from cellactors.persistence.store.metered import key_kind

#: Every kind a request can be classified as.
KINDS = frozenset(
    {"batch", "snapshot", "own", "seal", "lease", "peer-auth", "probe", "other", "list", "delete"}
)
#: Methods that change the store.
WRITE_METHODS = frozenset({"PUT", "POST", "DELETE"})
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)
_ERROR_CODES = {
    400: "BadRequest",
    403: "AccessDenied",
    404: "NoSuchKey",
    409: "OperationAborted",
    412: "PreconditionFailed",
    500: "InternalError",
    502: "BadGateway",
    503: "SlowDown",
    504: "GatewayTimeout",
}
_GATE_POLL = 0.02  # how often a held request looks at the proxy's stop flag


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` before forwarding."""

    seconds: float
    name: ClassVar[str] = "delay"


@dataclass(frozen=True)
class Fail:
    """Answer ``status`` with an S3 XML error body, without forwarding."""

    status: int = 503
    code: str | None = None
    name: ClassVar[str] = "fail"


@dataclass(frozen=True)
class Spurious412:
    """Answer ``412 PreconditionFailed`` without forwarding (the write did not happen)."""

    name: ClassVar[str] = "spurious_412"


@dataclass(frozen=True)
class Hang:
    """Never forward; close the connection unanswered once released or stopped."""

    name: ClassVar[str] = "hang"


@dataclass(frozen=True)
class ApplyThenDrop:
    """Forward (the store applies it), then close the connection without answering."""

    name: ClassVar[str] = "apply_then_drop"


@dataclass(frozen=True)
class Hold:
    """Hold until the rule's gate is released, then forward and answer (a late landing).
    If the proxy stops first, the request is dropped unforwarded."""

    name: ClassVar[str] = "hold"


@dataclass(frozen=True)
class ClockOffset:
    """Forward, and rewrite the answer's ``Date`` as if the store's clock were off by
    ``seconds`` (RFC 1123, whole seconds like every HTTP date)."""

    seconds: float
    name: ClassVar[str] = "clock_offset"


@dataclass(frozen=True)
class LagListings:
    """Forward a listing, then leave out of its answer every object whose ``LastModified``
    is within the last ``seconds`` (a store whose listings omit recent writes)."""

    seconds: float
    name: ClassVar[str] = "lag_listings"


Action = Delay | Fail | Spurious412 | Hang | ApplyThenDrop | Hold | ClockOffset | LagListings

_CONTENTS = re.compile(rb"<Contents>.*?</Contents>", re.DOTALL)
_MODIFIED = re.compile(rb"<LastModified>([^<]+)</LastModified>")
_KEY_COUNT = re.compile(rb"<KeyCount>\d+</KeyCount>")


def lagging_listing(body: bytes, seconds: float, now: float) -> bytes:
    """A ListObjectsV2 answer without the objects modified after ``now - seconds``."""
    kept = 0

    def keep(match: re.Match[bytes]) -> bytes:
        nonlocal kept
        found = _MODIFIED.search(match.group(0))
        if found is not None:
            stamp = found.group(1).decode().replace("Z", "+00:00")
            if datetime.datetime.fromisoformat(stamp).timestamp() > now - seconds:
                return b""
        kept += 1
        return match.group(0)

    body = _CONTENTS.sub(keep, body)
    return _KEY_COUNT.sub(f"<KeyCount>{kept}</KeyCount>".encode(), body, count=1)


# --------------------------------------------------------------------------- rules and log


def _names(value: str | Collection[str] | None, upper: bool = False) -> frozenset[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    return frozenset(v.upper() if upper else v for v in items)


@dataclass(eq=False)
class Rule:
    """One fault: which requests it matches and what it does to them.

    A request matches when its kind, method and key (``re.search``) fit. ``times`` limits
    the rule to its first N applications (None: every match); with ``probability`` each
    match applies with that chance, drawn from a ``random.Random(seed)`` (deterministic for
    a given sequence of matches); ``active_for`` ends the rule that many seconds after it
    first matched a request (an outage window). Requests held by :class:`Hang` or
    :class:`Hold` wait for :attr:`gate`; :attr:`arrived` is set when the rule first applies.
    """

    action: Action
    kinds: frozenset[str] | None = None
    methods: frozenset[str] | None = None
    key: re.Pattern[str] | None = None
    times: int | None = None
    probability: float | None = None
    seed: int = 0
    active_for: float | None = None
    gate: threading.Event = field(default_factory=threading.Event, repr=False)
    arrived: threading.Event = field(default_factory=threading.Event, repr=False)
    applied: int = 0
    first_match: float | None = None
    first_applied: float | None = None
    _held: int = field(default=0, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        unknown = (self.kinds or frozenset()) - KINDS
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}; known: {sorted(KINDS)}")
        self._rng = random.Random(self.seed)

    def release(self) -> None:
        """Open the gate: held requests go on (Hold forwards, Hang closes unanswered), and
        later matches pass straight through the gate."""
        self.gate.set()

    @property
    def held(self) -> int:
        """Requests waiting at this rule's gate right now."""
        with self._cond:
            return self._held

    def wait_arrived(self, timeout: float) -> None:
        """Block until the rule has applied to a request (AssertionError after ``timeout``)."""
        if not self.arrived.wait(timeout):
            raise AssertionError(f"no request matched {self} within {timeout:g}s")

    def wait_held(self, count: int, timeout: float) -> None:
        """Block until at least ``count`` requests wait at the gate."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._held >= count, timeout):
                raise AssertionError(
                    f"{self._held} of {count} requests held by {self} after {timeout:g}s"
                )

    def _matches(self, kind: str, method: str, key: str) -> bool:
        return (
            (self.kinds is None or kind in self.kinds)
            and (self.methods is None or method in self.methods)
            and (self.key is None or self.key.search(key) is not None)
        )

    def _take(self, kind: str, method: str, key: str, now: float) -> bool:
        """Whether the rule applies to this request (call under the proxy's lock)."""
        if not self._matches(kind, method, key):
            return False
        if self.first_match is None:
            self.first_match = now
        if self.active_for is not None and now > self.first_match + self.active_for:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        if self.probability is not None and self._rng.random() >= self.probability:
            return False
        self.applied += 1
        if self.first_applied is None:
            self.first_applied = now
        return True

    def _hold_change(self, delta: int) -> None:
        with self._cond:
            self._held += delta
            self._cond.notify_all()


@dataclass
class Request:
    """One request as the proxy saw it. Times are ``time.time()``.

    ``status`` is what the client was answered (None: the connection was closed without an
    answer); ``store_status`` what the store answered (None: never forwarded). ``body`` is
    kept for ``own.json`` PUTs only.
    """

    seq: int
    proxy: str
    method: str
    kind: str
    key: str
    query: str
    arrived: float
    action: str = "forward"
    answered: float | None = None
    status: int | None = None
    store_status: int | None = None
    store_answered: float | None = None
    if_match: str | None = None
    if_none_match: str | None = None
    etag: str | None = None
    date: str | None = None
    body: bytes | None = None

    @property
    def applied(self) -> bool:
        """The store accepted it (whatever the client heard)."""
        return self.store_status is not None and 200 <= self.store_status < 300

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS

    def record(self) -> dict[str, Any]:
        """The JSON body of an ``own.json`` PUT."""
        assert self.body is not None, f"no body kept for {self}"
        value: dict[str, Any] = json.loads(self.body)
        return value


def classify(method: str, path: str, query: str, prefix: str = "") -> tuple[str, str]:
    """(kind, key) of a path-style S3 request; the key is relative to the bucket and the
    fleet ``prefix``, and is the listed prefix for a ``list``."""
    parts = path.lstrip("/").split("/", 1)
    key = unquote(parts[1]) if len(parts) > 1 else ""
    if prefix and key.startswith(prefix.rstrip("/") + "/"):
        key = key[len(prefix.rstrip("/")) + 1 :]
    if method == "DELETE":
        return "delete", key
    if not key:
        params = parse_qs(query, keep_blank_values=True)
        if method == "GET" and params.get("list-type") == ["2"]:
            listed = params.get("prefix", [""])[0]
            if prefix and listed.startswith(prefix.rstrip("/") + "/"):
                listed = listed[len(prefix.rstrip("/")) + 1 :]
            return "list", listed
        return "other", ""
    return key_kind(key), key


def error_xml(status: int, code: str | None, resource: str, request_id: str) -> bytes:
    """An S3 error document."""
    code = code or _ERROR_CODES.get(status, "InternalError")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{escape(code)}</Code>"
        f"<Message>injected by FaultProxy: {escape(code)}</Message>"
        f"<Resource>{escape(resource)}</Resource>"
        f"<RequestId>{escape(request_id)}</RequestId></Error>"
    ).encode()


# --------------------------------------------------------------------------- the proxy


class FaultProxy:
    """An S3 reverse proxy on loopback with fault rules; see the module docstring.

    Use :meth:`start` (or ``with``), point a client at :attr:`endpoint`, add rules with the
    helpers (:meth:`delay`, :meth:`fail`, :meth:`spurious_412`, :meth:`hang`,
    :meth:`apply_then_drop`, :meth:`hold`, :meth:`clock_offset`) and read :meth:`log`.
    The first rule (in the order added) that applies to a request decides its action.
    """

    def __init__(self, upstream: str, name: str = "proxy", prefix: str = "") -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"upstream must be http://HOST:PORT, not {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.name = name
        self.prefix = prefix
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._log: list[Request] = []
        self._seq = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle

    def start(self) -> FaultProxy:
        """Listen on a free loopback port and serve in a background thread."""
        assert self._server is None, "already started"
        self._server = _Server(("127.0.0.1", 0), self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fault-proxy-{self.name}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: held requests are dropped unanswered, open connections closed."""
        self.stopping.set()
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- rules

    def add(
        self,
        action: Action,
        *,
        kind: str | Collection[str] | None = None,
        method: str | Collection[str] | None = None,
        key: str | None = None,
        times: int | None = None,
        probability: float | None = None,
        seed: int = 0,
        active_for: float | None = None,
    ) -> Rule:
        """Add a rule (thread-safe); returns it for :meth:`Rule.release`, waits and
        :meth:`remove`."""
        rule = Rule(
            action,
            kinds=_names(kind),
            methods=_names(method, upper=True),
            key=re.compile(key) if key is not None else None,
            times=times,
            probability=probability,
            seed=seed,
            active_for=active_for,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def delay(self, seconds: float, **match: Any) -> Rule:
        return self.add(Delay(seconds), **match)

    def fail(self, status: int = 503, code: str | None = None, **match: Any) -> Rule:
        return self.add(Fail(status, code), **match)

    def spurious_412(self, **match: Any) -> Rule:
        return self.add(Spurious412(), **match)

    def hang(self, **match: Any) -> Rule:
        return self.add(Hang(), **match)

    def apply_then_drop(self, **match: Any) -> Rule:
        return self.add(ApplyThenDrop(), **match)

    def hold(self, **match: Any) -> Rule:
        return self.add(Hold(), **match)

    def clock_offset(self, seconds: float, **match: Any) -> Rule:
        return self.add(ClockOffset(seconds), **match)

    def lag_listings(self, seconds: float, **match: Any) -> Rule:
        return self.add(LagListings(seconds), kind="list", **match)

    def remove(self, rule: Rule) -> None:
        """Stop matching new requests with ``rule`` (requests it holds stay held until its
        gate is released)."""
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        """Remove every rule and release every gate."""
        with self._lock:
            rules, self._rules = self._rules, []
        for rule in rules:
            rule.release()

    # --- log

    def log(self) -> list[Request]:
        """A copy of every request so far, in arrival order."""
        with self._lock:
            return [replace(r) for r in self._log]

    def requests(
        self,
        *,
        kind: str | Collection[str] | None = None,
        method: str | Collection[str] | None = None,
        key: str | None = None,
        action: str | None = None,
        since: float | None = None,
    ) -> list[Request]:
        """Logged requests filtered by kind, method, key regex, action and arrival time."""
        kinds, methods = _names(kind), _names(method, upper=True)
        pattern = re.compile(key) if key is not None else None
        return [
            r
            for r in self.log()
            if (kinds is None or r.kind in kinds)
            and (methods is None or r.method in methods)
            and (pattern is None or pattern.search(r.key))
            and (action is None or r.action == action)
            and (since is None or r.arrived >= since)
        ]

    def wait_request(self, what: str, check: Callable[[Request], bool], timeout: float) -> Request:
        """The first logged request satisfying ``check``, polling until ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for r in self.log():
                if check(r):
                    return r
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.name}: no request {what} within {timeout:g}s")
            self.stopping.wait(0.02)

    def own_writes(self) -> list[Request]:
        """``own.json`` PUTs the store applied (whether or not the client heard so)."""
        return [r for r in self.requests(kind="own", method="PUT") if r.applied]

    # --- internals used by the handler

    def _begin(
        self, method: str, path: str, query: str, headers: Any, body: bytes
    ) -> tuple[Request, Rule | None]:
        kind, key = classify(method, path, query, self.prefix)
        now = time.time()
        with self._lock:
            self._seq += 1
            rec = Request(
                seq=self._seq,
                proxy=self.name,
                method=method,
                kind=kind,
                key=key,
                query=query,
                arrived=now,
                if_match=headers.get("If-Match"),
                if_none_match=headers.get("If-None-Match"),
                body=body if kind == "own" and method == "PUT" else None,
            )
            self._log.append(rec)
            rule = next((r for r in self._rules if r._take(kind, method, key, now)), None)
            if rule is not None:
                rec.action = rule.action.name
        if rule is not None:
            rule.arrived.set()
        return rec, rule

    def _update(self, rec: Request, **fields: Any) -> None:
        with self._lock:
            for name, value in fields.items():
                setattr(rec, name, value)

    def _wait_gate(self, rule: Rule) -> bool:
        """Wait at ``rule``'s gate; True once released, False if the proxy stops first."""
        rule._hold_change(+1)
        try:
            while not rule.gate.wait(_GATE_POLL):
                if self.stopping.is_set():
                    return False
            return not self.stopping.is_set()
        finally:
            rule._hold_change(-1)


@dataclass
class _Upstream:
    """What the store answered."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class _Handler(http.server.BaseHTTPRequestHandler):
    """One client connection (HTTP/1.1 keep-alive); one upstream connection beside it."""

    protocol_version = "HTTP/1.1"
    server: _Server
    _conn: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the proxy keeps its own log."""

    def do_GET(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- one request

    def _handle(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        target = urlsplit(self.path)
        rec, rule = proxy._begin(self.command, target.path, target.query, self.headers, body)
        action = rule.action if rule is not None else None
        if isinstance(action, Delay) and proxy.stopping.wait(action.seconds):
            return self._drop(rec)
        if isinstance(action, (Fail, Spurious412)):
            status = action.status if isinstance(action, Fail) else 412
            code = action.code if isinstance(action, Fail) else "PreconditionFailed"
            xml = error_xml(status, code, target.path, f"faultproxy-{rec.seq}")
            return self._answer(rec, status, [("Content-Type", "application/xml")], xml)
        if isinstance(action, Hang):
            assert rule is not None
            proxy._wait_gate(rule)
            return self._drop(rec)
        if isinstance(action, Hold):
            assert rule is not None
            if not proxy._wait_gate(rule):
                return self._drop(rec)
        try:
            up = self._forward(body)
        except (OSError, http.client.HTTPException) as err:
            xml = error_xml(502, "BadGateway", f"{target.path}: {err!r}", f"fp-{rec.seq}")
            return self._answer(rec, 502, [("Content-Type", "application/xml")], xml)
        etag = next((v for k, v in up.headers if k.lower() == "etag"), None)
        proxy._update(rec, store_status=up.status, store_answered=time.time(), etag=etag)
        if isinstance(action, ApplyThenDrop):
            return self._drop(rec)
        headers = up.headers
        if isinstance(action, ClockOffset):
            skewed = email.utils.formatdate(time.time() + action.seconds, usegmt=True)
            headers = [(k, v) for k, v in headers if k.lower() != "date"] + [("Date", skewed)]
        answer = up.body
        if isinstance(action, LagListings) and up.status == 200:
            answer = lagging_listing(up.body, action.seconds, time.time())
        length = next((v for k, v in up.headers if k.lower() == "content-length"), None)
        return self._answer(rec, up.status, headers, answer, reason=up.reason, length=length)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, body: bytes) -> _Upstream:
        """Send the request as received to the store; one fresh retry when a reused
        keep-alive connection turns out to be closed (nothing was answered on it). A
        conditional request always goes on a fresh connection, so it is never sent twice:
        the store may have applied it before the connection broke."""
        if self._conn is not None and (
            "If-Match" in self.headers or "If-None-Match" in self.headers
        ):
            self._conn.close()
            self._conn = None
        for attempt in (1, 2):
            reused = self._conn is not None
            if self._conn is None:
                host, port = self.server.proxy.upstream
                self._conn = http.client.HTTPConnection(host, port, timeout=120)
            conn = self._conn
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                        conn.putheader(name, value)
                if body or self.command in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body or None)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self._conn = None
                if reused and attempt == 1:
                    continue
                raise
            if resp.will_close:
                conn.close()
                self._conn = None
            return _Upstream(resp.status, resp.reason, resp.getheaders(), data)
        raise AssertionError("unreachable")

    def _answer(
        self,
        rec: Request,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        reason: str | None = None,
        length: str | None = None,
    ) -> None:
        date = None
        self.send_response_only(status, reason)  # headers are buffered until end_headers
        for name, value in headers:
            lower = name.lower()
            if lower in _HOP_BY_HOP or lower == "content-length":
                continue
            if lower == "date":
                date = value
            self.send_header(name, value)
        if date is None:
            date = email.utils.formatdate(time.time(), usegmt=True)
            self.send_header("Date", date)
        if self.command == "HEAD":
            self.send_header("Content-Length", length or "0")
        else:
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        # Logged before the first byte leaves, so a client that has its answer finds it logged.
        self.server.proxy._update(rec, answered=time.time(), status=status, date=date)
        try:
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            self.server.proxy._update(rec, status=None)

    def _drop(self, rec: Request) -> None:
        """Close the client connection without an answer."""
        self.close_connection = True
        self.server.proxy._update(rec, answered=time.time())
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(http.server.ThreadingHTTPServer):
    """A threaded HTTP server that can close every open connection on stop."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], proxy: FaultProxy) -> None:
        self.proxy = proxy
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._open_lock:
            conns = list(self._open)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
