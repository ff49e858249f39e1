"""The GCS dialect, through google-cloud-storage.

Tokens are object generations. Conditional writes use ``if_generation_match`` (0 means
"create only"), go out as one multipart request (a resumable upload would split the write
into several requests, and fake-gcs-server ignores preconditions on those) and are never
retried by the client: a retried write that had already committed would come back as a
false 412.

One client per process and emulator setting is shared by every :class:`GcsBucket`. When
``STORAGE_EMULATOR_HOST`` is set the library talks to that emulator, and we connect
anonymously; otherwise Application Default Credentials are used.
"""

from __future__ import annotations

import datetime
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import google.api_core.exceptions as gexc
import google.auth.exceptions
import requests
import requests.adapters
import urllib3.exceptions
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from cellactors.clock import StoreClock, mono, shared_store_clock
from cellactors.errors import (
    AmbiguousWrite,
    BucketError,
    StoreCredentialsError,
    StoreUnreachable,
)
from cellactors.persistence.store.bucket import (
    MAX_CAS_BODY,
    Absent,
    Applied,
    Bucket,
    CasResult,
    Guard,
    ObjectInfo,
    Rejected,
    StoredObject,
    folder_cursor,
    join_prefix,
    strip_prefix,
)
from cellactors.persistence.store.gate import refuse_if_fenced

EMULATOR_VAR = "STORAGE_EMULATOR_HOST"
_EMULATOR_PROJECT = "cellactors-emulator"
_POOL_SIZE = 64
_CONTENT_TYPE = "application/octet-stream"

# Failures below HTTP: the request may have reached the server and committed.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    requests.exceptions.RequestException,
    google.auth.exceptions.TransportError,
    ConnectionError,
    TimeoutError,
)
_FAILURES: tuple[type[BaseException], ...] = (
    gexc.GoogleAPIError,
    google.auth.exceptions.RefreshError,
    google.auth.exceptions.DefaultCredentialsError,
    *_TRANSPORT_ERRORS,
)

# A credential the library could not find, load or refresh, or a store that refused it.
_CREDENTIAL_ERRORS: tuple[type[BaseException], ...] = (
    google.auth.exceptions.DefaultCredentialsError,
    google.auth.exceptions.RefreshError,
    gexc.Unauthorized,
    gexc.Forbidden,
)


def _never_connected(err: BaseException) -> bool:
    """True when no connection was made (refused, connect timeout, unknown host), so the
    request never reached the store; looks through requests' and api_core's wrappers."""
    seen: set[int] = set()
    todo: list[BaseException] = [err]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(
            cur,
            requests.exceptions.ConnectTimeout
            | urllib3.exceptions.NewConnectionError
            | urllib3.exceptions.ConnectTimeoutError,
        ):
            return True
        nested = [getattr(cur, "reason", None), getattr(cur, "cause", None), cur.__cause__]
        nested += [a for a in cur.args if isinstance(a, BaseException)]
        todo.extend(n for n in nested if isinstance(n, BaseException))
    return False


def failure(what: str, err: BaseException) -> BucketError:
    """The typed error for a request that failed: missing or refused credentials
    (:class:`StoreCredentialsError`), no connection (:class:`StoreUnreachable`), or any
    other failure (:class:`BucketError`)."""
    message = f"{what} failed: {err}"
    if isinstance(err, _CREDENTIAL_ERRORS):
        return StoreCredentialsError(message)
    if _never_connected(err):
        return StoreUnreachable(message)
    return BucketError(message)


_clients_lock = threading.Lock()
_clients: dict[str | None, Any] = {}


def _new_client(emulator: str | None) -> Any:
    """Build a storage client: anonymous against an emulator, else ADC."""
    if emulator:
        project = os.environ.get("GOOGLE_CLOUD_PROJECT") or _EMULATOR_PROJECT
        anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
        client = storage.Client(project=project, credentials=anonymous)
    else:
        try:
            client = storage.Client()
        except google.auth.exceptions.DefaultCredentialsError as err:
            raise StoreCredentialsError(
                f"no Google Application Default Credentials for a gs:// bucket: {err}"
            ) from err
        except OSError:
            # Credentials found but no project: object operations do not need one.
            client = storage.Client(project=None)
    # The library fetches bucket metadata in background threads for tracing attributes;
    # that adds requests (and an IAM permission) the protocol does not account for.
    if hasattr(client, "_bucket_metadata_cache"):
        client._bucket_metadata_cache = None
    # requests keeps 10 connections per host by default; cells call from many threads.
    # (An mTLS session has its own adapter, which we must not replace.)
    session = client._http
    # Every HTTP request, each of the library's retries included, passes a fenced node's gate.
    session.send = _gated(session.send)
    # Every answer's Date feeds the store's clock (the hook runs once its headers are in).
    session.hooks["response"].append(_clock_feeder(_store_clock(emulator)))
    if not getattr(session, "is_mtls", False):
        adapter = requests.adapters.HTTPAdapter(pool_connections=8, pool_maxsize=_POOL_SIZE)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
    return client


def _gated(send: Callable[..., Any]) -> Callable[..., Any]:
    """``send``, refused (:class:`~cellactors.errors.Fenced`, nothing sent) while the calling
    thread's request passes the gate of a node that has fenced itself."""

    def send_through_gate(request: Any, **kwargs: Any) -> Any:
        refuse_if_fenced()
        return send(request, **kwargs)

    return send_through_gate


def _clock_feeder(clock: StoreClock) -> Callable[..., None]:
    """A requests response hook feeding each answer's ``Date`` to ``clock``: the request
    left ``elapsed`` before its headers came back."""

    def feed(response: requests.Response, *_args: Any, **_kwargs: Any) -> None:
        received = mono()
        elapsed = response.elapsed.total_seconds() if response.elapsed else 0.0
        clock.observe(received - elapsed, received, response.headers.get("date"))

    return feed


def _client() -> tuple[Any, StoreClock]:
    """The process-wide client for the current emulator setting, created on first use, and
    the clock of the store it talks to."""
    emulator = os.environ.get(EMULATOR_VAR) or None
    with _clients_lock:
        client = _clients.get(emulator)
        if client is None:
            client = _new_client(emulator)
            _clients[emulator] = client
        return client, _store_clock(emulator)


def _store_clock(emulator: str | None) -> StoreClock:
    return shared_store_clock(("gcs", emulator), emulator or "storage.googleapis.com")


def _ms(value: datetime.datetime | None) -> int:
    return int(value.timestamp() * 1000) if value is not None else 0


def _token(key: str, generation: Any) -> str:
    if generation is None:
        raise BucketError(f"{key}: the store returned no object generation")
    return str(int(generation))


def _status(err: gexc.GoogleAPICallError) -> int:
    code = err.code
    return int(code) if isinstance(code, int) else 0


class GcsBucket(Bucket):
    """A bucket in the GCS dialect (Google Cloud Storage or fake-gcs-server)."""

    def __init__(self, bucket: str, prefix: str = "", *, timeout: float = 10.0) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.timeout = timeout
        self.spec = f"gs://{bucket}" + (f"/{prefix}" if prefix else "")
        self._client, self._clock = _client()
        self._bucket = self._client.bucket(bucket)
        self._retry: Retry = DEFAULT_RETRY.with_timeout(timeout)

    @property
    def clock(self) -> StoreClock:
        return self._clock

    def _key(self, key: str) -> str:
        return join_prefix(self.prefix, key)

    def get(self, key: str) -> StoredObject | None:
        return self._get(key, self._retry)

    def get_once(self, key: str) -> StoredObject | None:
        return self._get(key, None)

    def _get(self, key: str, retry: Any) -> StoredObject | None:
        blob = self._bucket.blob(self._key(key))
        try:
            # One request: the generation comes from the download's response headers, and
            # a resumed download is pinned to that generation by the library.
            body = blob.download_as_bytes(timeout=self.timeout, retry=retry)
        except gexc.NotFound:
            return None
        except _FAILURES as err:
            raise failure(f"GET {key}", err) from err
        return StoredObject(body=bytes(body), token=_token(key, blob.generation))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            blob = self._bucket.get_blob(self._key(key), timeout=self.timeout, retry=self._retry)
        except _FAILURES as err:
            raise failure(f"HEAD {key}", err) from err
        if blob is None:
            return None
        return ObjectInfo(
            key=key,
            token=_token(key, blob.generation),
            size=int(blob.size or 0),
            last_modified_ms=_ms(blob.updated),
        )

    def put(self, key: str, body: bytes) -> str:
        blob = self._bucket.blob(self._key(key))
        try:
            # Plain writes are idempotent (same key, same bytes), so retries are allowed.
            blob.upload_from_string(
                body, content_type=_CONTENT_TYPE, timeout=self.timeout, retry=self._retry
            )
        except _FAILURES as err:
            raise failure(f"PUT {key}", err) from err
        return _token(key, blob.generation)

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        if len(body) > MAX_CAS_BODY:
            raise ValueError(f"conditional body of {len(body)} bytes exceeds {MAX_CAS_BODY}")
        if isinstance(guard, Absent):
            generation = 0
        else:
            try:
                generation = int(guard.token)
            except ValueError:
                # Not a generation (e.g. an S3 ETag): it cannot match any GCS object.
                return Rejected("token is not a generation")
            if generation <= 0:
                return Rejected("token is not a generation")
        blob = self._bucket.blob(self._key(key), chunk_size=None)
        try:
            blob.upload_from_string(
                body,
                content_type=_CONTENT_TYPE,
                if_generation_match=generation,
                timeout=self.timeout,
                retry=None,
            )
        except gexc.GoogleAPICallError as err:
            status = _status(err)
            if status == 412:
                return Rejected("412")
            if status == 404 and not isinstance(guard, Absent):
                return Rejected("missing")
            if status >= 500 or status in (0, 408):
                raise AmbiguousWrite(f"conditional PUT {key}: HTTP {status}: {err}") from err
            raise failure(f"conditional PUT {key}: HTTP {status}", err) from err
        except (
            google.auth.exceptions.RefreshError,
            google.auth.exceptions.DefaultCredentialsError,
        ) as err:
            raise failure(f"conditional PUT {key}", err) from err  # no token: never sent
        except _TRANSPORT_ERRORS as err:
            if _never_connected(err):  # never sent: a definite failure, not an ambiguous one
                raise failure(f"conditional PUT {key}", err) from err
            raise AmbiguousWrite(f"conditional PUT {key}: {err}") from err
        except gexc.GoogleAPIError as err:
            raise AmbiguousWrite(f"conditional PUT {key}: {err}") from err
        return Applied(_token(key, blob.generation))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for page in self.list_pages(prefix, 1000):
            yield from page

    def list_pages(self, prefix: str, page_size: int) -> Iterator[Sequence[ObjectInfo]]:
        try:
            blobs = self._client.list_blobs(
                self.bucket,
                prefix=self._key(prefix),
                page_size=page_size,
                timeout=self.timeout,
                retry=self._retry,
            )
            for page in blobs.pages:
                yield [
                    ObjectInfo(
                        key=strip_prefix(self.prefix, str(blob.name)),
                        token=_token(str(blob.name), blob.generation),
                        size=int(blob.size or 0),
                        last_modified_ms=_ms(blob.updated),
                    )
                    for blob in page
                ]
        except _FAILURES as err:
            raise failure(f"LIST {prefix}", err) from err

    def list_folders(self, prefix: str, start_after: str = "") -> Iterator[str]:
        full = self._key(prefix)
        try:
            blobs = self._client.list_blobs(
                self.bucket,
                prefix=full,
                delimiter="/",
                start_offset=folder_cursor(full, start_after) if start_after else None,
                timeout=self.timeout,
                retry=self._retry,
            )
            for page in blobs.pages:
                for folder in sorted(page.prefixes):
                    yield strip_prefix(self.prefix, str(folder))[len(prefix) :].rstrip("/")
        except _FAILURES as err:
            raise failure(f"LIST {prefix}", err) from err

    def delete(self, key: str) -> None:
        try:
            self._bucket.delete_blob(self._key(key), timeout=self.timeout)
        except gexc.NotFound:
            return
        except _FAILURES as err:
            raise failure(f"DELETE {key}", err) from err

    def exists(self) -> bool:
        """Whether the bucket itself exists (a bucket lookup)."""
        try:
            return self._client.lookup_bucket(self.bucket, timeout=self.timeout) is not None
        except _FAILURES as err:
            raise failure(f"looking up bucket {self.bucket}", err) from err

    def ensure_exists(self) -> None:
        """Create the bucket if it is missing (embedded stores and tests)."""
        try:
            if self._client.lookup_bucket(self.bucket, timeout=self.timeout) is not None:
                return
            self._client.create_bucket(self.bucket, timeout=self.timeout)
        except gexc.Conflict:
            return  # created concurrently
        except _FAILURES as err:
            raise failure(f"creating bucket {self.bucket}", err) from err
