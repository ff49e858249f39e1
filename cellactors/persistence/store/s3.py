"""The S3 dialect, through boto3.

Two clients share one botocore session: a plain one with standard retries for reads and
plain writes, and a conditional one with retries disabled, because a retried conditional
PUT that had already committed would come back as a false 412.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
import botocore.config
import botocore.exceptions
import botocore.httpsession

from cellactors.clock import StoreClock, mono, shared_store_clock
from cellactors.errors import AmbiguousWrite, BucketError, StoreCredentialsError, StoreUnreachable
from cellactors.persistence.store.bucket import (
    MAX_CAS_BODY,
    Absent,
    Applied,
    Bucket,
    CasResult,
    Guard,
    Match,
    ObjectInfo,
    Rejected,
    StoredObject,
    folder_cursor,
    join_prefix,
    strip_prefix,
)
from cellactors.persistence.store.gate import refuse_if_fenced
from cellactors.persistence.store.s3_direct import DirectS3, ListPage, Unanswered, Undecided

_REJECT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_OWNED = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}  # create_bucket lost a race
# Answers by which a store refuses a request as such, before acting on it: a conditional
# PUT answered so was not applied. Every other answer but a success or a rejection may come
# after the write was applied (a proxy's timeout, a throttle, a 5xx): ambiguous.
_REFUSED = {301, 302, 307, 308, 400, 401, 403, 404, 405, 409, 411, 413}
_ERROR_CODE = re.compile(rb"<Code>\s*([A-Za-z0-9.]+)\s*</Code>")

# Raised before a request is sent: no credentials could be found or loaded.
_CREDENTIAL_ERRORS: tuple[type[Exception], ...] = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.CredentialRetrievalError,
    botocore.exceptions.ProfileNotFound,
    botocore.exceptions.SSOError,
    botocore.exceptions.NoAuthTokenError,
)
# Error codes of a store that refused the credentials it was given.
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccessDenied",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
}
# The connection was never made, so the request never reached the store.
_UNREACHABLE_ERRORS: tuple[type[Exception], ...] = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
    botocore.exceptions.ProxyConnectionError,
)

_clients_lock = threading.Lock()
_clients: dict[tuple[Any, ...], tuple[Any, Any, DirectS3 | None, StoreClock]] = {}
_sent = threading.local()  # when this thread last sent a boto3 request (mono)


def _note_sent(**_kwargs: Any) -> None:
    _sent.at = mono()


def _clock_feeder(clock: StoreClock) -> Any:
    """A ``response-received`` handler that feeds every boto3 answer's ``Date`` to
    ``clock`` (the request was sent from the same thread, :func:`_note_sent`)."""

    def feed(response_dict: dict[str, Any] | None = None, **_kwargs: Any) -> None:
        if response_dict is None:
            return
        received = mono()
        headers = response_dict.get("headers") or {}
        clock.observe(getattr(_sent, "at", received), received, headers.get("date"))

    return feed


def _client_pair(
    endpoint: str | None,
    region: str | None,
    access_key: str | None,
    secret_key: str | None,
    timeout: float,
) -> tuple[Any, Any, DirectS3 | None, StoreClock]:
    """Return (plain client, conditional client, direct client or None, the store's clock),
    created once per process per config; every answer on any of them feeds the clock."""
    key = (endpoint, region, access_key, secret_key, timeout)
    with _clients_lock:
        pair = _clients.get(key)
        if pair is None:
            try:
                session = boto3.session.Session(
                    aws_access_key_id=access_key,
                    aws_secret_access_key=secret_key,
                    region_name=region or ("us-east-1" if endpoint else None),
                )
            except botocore.exceptions.BotoCoreError as err:  # e.g. AWS_PROFILE names no profile
                raise failure("S3 session", err) from err
            s3_opts = {"addressing_style": "path"} if endpoint else {}
            common: dict[str, Any] = {
                "connect_timeout": min(timeout, 5.0),
                "read_timeout": timeout,
                "s3": s3_opts,
                "max_pool_connections": 64,
                "request_checksum_calculation": "when_required",
                "response_checksum_validation": "when_required",
            }
            plain = session.client(
                "s3",
                endpoint_url=endpoint,
                config=botocore.config.Config(
                    retries={"mode": "standard", "max_attempts": 5}, **common
                ),
            )
            cas = session.client(
                "s3",
                endpoint_url=endpoint,
                config=botocore.config.Config(retries={"total_max_attempts": 1}, **common),
            )
            clock = shared_store_clock(("s3", plain.meta.endpoint_url), plain.meta.endpoint_url)
            for client in (plain, cas):
                # Every HTTP request, each botocore retry included, passes a fenced node's gate.
                client.meta.events.register("before-send.s3", refuse_if_fenced)
                client.meta.events.register("before-send.s3", _note_sent)
                client.meta.events.register("response-received.s3", _clock_feeder(clock))
            pair = (plain, cas, _direct(session, plain, endpoint, timeout, clock), clock)
            _clients[key] = pair
        return pair


def _direct(
    session: Any, plain: Any, endpoint: str | None, timeout: float, clock: StoreClock
) -> DirectS3 | None:
    """The direct client for plain GETs and PUTs, where it may be used
    (:mod:`cellactors.persistence.store.s3_direct`)."""
    if not DirectS3.usable(endpoint):
        return None
    credentials = session.get_credentials()
    if credentials is None:
        return None  # boto3 raises the credentials error on the first request
    return DirectS3(
        plain.meta.endpoint_url,
        plain.meta.region_name,
        credentials,
        timeout=timeout,
        ca_certs=botocore.httpsession.get_cert_path(True),
        clock=clock,
    )


def _status(err: botocore.exceptions.ClientError) -> tuple[int, str]:
    resp: dict[str, Any] = err.response
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    code = str(resp.get("Error", {}).get("Code", ""))
    return status, code


def failure(what: str, err: Exception) -> BucketError:
    """The typed error for a request that failed definitely: missing or refused credentials
    (:class:`StoreCredentialsError`), no connection (:class:`StoreUnreachable`), or any
    other failure (:class:`BucketError`)."""
    message = f"{what} failed: {err}"
    if isinstance(err, _CREDENTIAL_ERRORS):
        return StoreCredentialsError(message)
    if isinstance(err, _UNREACHABLE_ERRORS):
        return StoreUnreachable(message)
    if isinstance(err, botocore.exceptions.ClientError):
        status, code = _status(err)
        if code in _CREDENTIAL_CODES or (status == 403 and code in ("", "403", "Forbidden")):
            return StoreCredentialsError(message)
    return BucketError(message)


def _is_missing(err: botocore.exceptions.ClientError) -> bool:
    """The object does not exist. A 404 with another code (``NoSuchBucket``: a wrong bucket
    name, a bucket deleted) is a failure, never an absent object."""
    status, code = _status(err)
    return code in _MISSING_CODES or (status == 404 and not code)


def _error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 error document, or "" when there is none."""
    found = _ERROR_CODE.search(body)
    return found.group(1).decode("ascii") if found else ""


def _judge_cas(key: str, status: int, code: str, guard: Guard) -> Rejected | None:
    """What a conditional PUT's failed answer says: Rejected (its condition failed, nothing
    was written), None (the store refused the request itself: a redirect, a refused
    signature, a missing bucket; nothing was applied, an error to raise), or
    :class:`AmbiguousWrite` for anything else (a 5xx, a 2xx that is not a clean success, a
    timeout or throttle a proxy may answer after forwarding the write): it may have been
    applied."""
    if status == 412 or code in _REJECT_CODES:
        return Rejected(code or str(status))
    if isinstance(guard, Match) and status == 404:
        # Stores answer If-Match on a missing key with 404 under various codes; either way
        # nothing was written.
        return Rejected("missing")
    if status in _REFUSED:
        return None
    raise AmbiguousWrite(f"conditional PUT {key}: HTTP {status} {code}".rstrip())


def _toggle_quotes(token: str) -> str:
    if len(token) >= 2 and token.startswith('"') and token.endswith('"'):
        return token[1:-1]
    return f'"{token}"'


def _same_etag(a: str, b: str) -> bool:
    return a.strip('"') == b.strip('"')


class S3Bucket(Bucket):
    """A bucket in the S3 dialect (AWS S3 or any store that speaks it)."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = endpoint
        self.spec = f"s3://{bucket}" + (f"/{prefix}" if prefix else "")
        self._plain, self._cas, self._direct, self._clock = _client_pair(
            endpoint, region, access_key, secret_key, timeout
        )

    @property
    def clock(self) -> StoreClock:
        return self._clock

    def _key(self, key: str) -> str:
        return join_prefix(self.prefix, key)

    def get(self, key: str) -> StoredObject | None:
        if self._direct is not None:
            try:
                return self._direct.get(self.bucket, self._key(key))
            except Undecided:
                pass  # boto3 sends it again, retries and classifies the failure
        return self._get(self._plain, key)

    def get_once(self, key: str) -> StoredObject | None:
        return self._get(self._cas, key)  # the client without retries

    def _get(self, client: Any, key: str) -> StoredObject | None:
        try:
            resp = client.get_object(Bucket=self.bucket, Key=self._key(key))
        except botocore.exceptions.ClientError as err:
            if _is_missing(err):
                return None
            raise failure(f"GET {key}", err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise failure(f"GET {key}", err) from err
        return StoredObject(body=resp["Body"].read(), token=str(resp["ETag"]))

    def head(self, key: str) -> ObjectInfo | None:
        try:
            resp = self._plain.head_object(Bucket=self.bucket, Key=self._key(key))
        except botocore.exceptions.ClientError as err:
            if _is_missing(err):
                return None
            raise failure(f"HEAD {key}", err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise failure(f"HEAD {key}", err) from err
        return ObjectInfo(
            key=key,
            token=str(resp["ETag"]),
            size=int(resp.get("ContentLength", 0)),
            last_modified_ms=int(resp["LastModified"].timestamp() * 1000),
        )

    def put(self, key: str, body: bytes) -> str:
        if self._direct is not None:
            try:
                return self._direct.put(self.bucket, self._key(key), body)
            except Undecided:
                pass  # sent again through boto3: a plain PUT of the same body is idempotent
        try:
            resp = self._plain.put_object(Bucket=self.bucket, Key=self._key(key), Body=body)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
            raise failure(f"PUT {key}", err) from err
        return str(resp["ETag"])

    def put_cas(self, key: str, body: bytes, guard: Guard) -> CasResult:
        if len(body) > MAX_CAS_BODY:
            raise ValueError(f"conditional body of {len(body)} bytes exceeds {MAX_CAS_BODY}")
        if isinstance(guard, Absent):
            return self._put_conditional(key, body, ("if-none-match", "*"), guard)
        result = self._put_conditional(key, body, ("if-match", guard.token), guard)
        if isinstance(result, Rejected) and result.reason != "missing":
            # Some stores only match one ETag spelling (quoted or bare). When the object
            # still carries our token, the rejection was about spelling: try the other one.
            current = self.head(key)
            if current is not None and _same_etag(current.token, guard.token):
                alt = ("if-match", _toggle_quotes(guard.token))
                return self._put_conditional(key, body, alt, guard)
        return result

    def _put_conditional(
        self, key: str, body: bytes, condition: tuple[str, str], guard: Guard
    ) -> CasResult:
        """Send the conditional PUT exactly once and classify its answer: Applied, Rejected,
        or :class:`AmbiguousWrite` when the store may have applied it."""
        if self._direct is not None:
            result = self._put_conditional_direct(self._direct, key, body, condition, guard)
            if result is not None:
                return result
        options = (
            {"IfNoneMatch": "*"} if condition[0] == "if-none-match" else {"IfMatch": condition[1]}
        )
        try:
            resp = self._cas.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=body, **options
            )
        except botocore.exceptions.ParamValidationError as err:
            raise BucketError(f"conditional PUT {key} is malformed: {err}") from err
        except botocore.exceptions.ClientError as err:
            status, code = _status(err)
            judged = _judge_cas(key, status, code, guard)
            if judged is not None:
                return judged
            raise failure(f"conditional PUT {key}", err) from err
        except (*_CREDENTIAL_ERRORS, *_UNREACHABLE_ERRORS) as err:
            raise failure(f"conditional PUT {key}", err) from err  # never sent: not ambiguous
        except botocore.exceptions.BotoCoreError as err:
            raise AmbiguousWrite(f"conditional PUT {key}: {err}") from err
        return Applied(str(resp["ETag"]))

    def _put_conditional_direct(
        self, direct: DirectS3, key: str, body: bytes, condition: tuple[str, str], guard: Guard
    ) -> CasResult | None:
        """The conditional PUT on the direct path; None when boto3 is to send it: it never
        left, or the store refused the request itself (nothing was applied; boto3 raises the
        classified error, or succeeds where this path's signature was what was refused)."""
        try:
            answer = direct.put_conditional(self.bucket, self._key(key), body, condition)
        except Undecided:
            return None
        except Unanswered as err:
            raise AmbiguousWrite(f"conditional PUT {key}: {err}") from err
        if not 200 <= answer.status < 300:
            return _judge_cas(key, answer.status, _error_code(answer.body), guard)
        etag = answer.headers.get("etag")
        if etag is None:
            raise AmbiguousWrite(f"conditional PUT {key}: applied without an ETag")
        return Applied(etag)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for page in self._pages(prefix, self._key(prefix)):
            for item in page.objects:
                yield dataclasses.replace(item, key=strip_prefix(self.prefix, item.key))

    def list_pages(self, prefix: str, page_size: int) -> Iterator[Sequence[ObjectInfo]]:
        for page in self._pages(prefix, self._key(prefix), max_keys=page_size):
            yield [
                dataclasses.replace(i, key=strip_prefix(self.prefix, i.key)) for i in page.objects
            ]

    def list_folders(self, prefix: str, start_after: str = "") -> Iterator[str]:
        full = self._key(prefix)
        cursor = folder_cursor(full, start_after) if start_after else None
        for page in self._pages(prefix, full, delimiter="/", start_after=cursor):
            for folder in page.folders:
                name = strip_prefix(self.prefix, folder)[len(prefix) :]
                yield name.rstrip("/")

    def _pages(
        self,
        prefix: str,
        full: str,
        *,
        delimiter: str | None = None,
        start_after: str | None = None,
        max_keys: int | None = None,
    ) -> Iterator[ListPage]:
        """The pages of a listing under ``full``. Each page is asked for on the direct path
        first and, when that answer is not clean, through boto3 from the same continuation
        token; ``prefix`` names the listing in errors."""
        token: str | None = None
        while True:
            page: ListPage | None = None
            if self._direct is not None:
                try:
                    page = self._direct.list_page(
                        self.bucket,
                        full,
                        token=token,
                        delimiter=delimiter,
                        start_after=start_after,
                        max_keys=max_keys,
                    )
                except Undecided:
                    pass  # boto3 lists this page again, retries and classifies the failure
            if page is None:
                page = self._boto3_page(prefix, full, token, delimiter, start_after, max_keys)
            yield page
            if page.next_token is None:
                return
            token = page.next_token

    def _boto3_page(
        self,
        prefix: str,
        full: str,
        token: str | None,
        delimiter: str | None,
        start_after: str | None,
        max_keys: int | None,
    ) -> ListPage:
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full}
        for name, value in (
            ("ContinuationToken", token),
            ("Delimiter", delimiter),
            ("StartAfter", start_after),
            ("MaxKeys", max_keys),
        ):
            if value is not None:
                args[name] = value
        try:
            resp = self._plain.list_objects_v2(**args)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
            raise failure(f"LIST {prefix}", err) from err
        next_token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        if resp.get("IsTruncated") and not next_token:
            raise BucketError(f"LIST {prefix}: a truncated page without a continuation token")
        return ListPage(
            objects=[
                ObjectInfo(
                    key=item["Key"],
                    token=str(item.get("ETag", "")),
                    size=int(item.get("Size", 0)),
                    last_modified_ms=int(item["LastModified"].timestamp() * 1000),
                )
                for item in resp.get("Contents", [])
            ],
            folders=[common["Prefix"] for common in resp.get("CommonPrefixes", [])],
            next_token=next_token,
        )

    def delete(self, key: str) -> None:
        try:
            self._plain.delete_object(Bucket=self.bucket, Key=self._key(key))
        except botocore.exceptions.ClientError as err:
            if not _is_missing(err):
                raise failure(f"DELETE {key}", err) from err
        except botocore.exceptions.BotoCoreError as err:
            raise failure(f"DELETE {key}", err) from err

    def exists(self) -> bool:
        """A HEAD bucket: False on a 404, raises on any other failure."""
        try:
            self._plain.head_bucket(Bucket=self.bucket)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
            if isinstance(err, botocore.exceptions.ClientError) and _status(err)[0] == 404:
                return False
            raise failure(f"HEAD bucket {self.bucket}", err) from err
        return True

    def ensure_exists(self) -> None:
        """Create the bucket if it is missing (embedded stores and tests)."""
        if self.exists():
            return
        try:
            self._plain.create_bucket(Bucket=self.bucket)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
            owned = isinstance(err, botocore.exceptions.ClientError) and _status(err)[1] in _OWNED
            if not owned:
                raise failure(f"creating bucket {self.bucket}", err) from err
