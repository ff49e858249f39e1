"""S3Bucket.put_cas classifies every answer of a store into Applied, Rejected or
AmbiguousWrite, and sends a conditional PUT exactly once (no client retry): on the direct
path (an explicit endpoint) and through boto3 (AWS's own endpoints, proxies) alike."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from cellactors.errors import AmbiguousWrite
from cellactors.persistence.store.bucket import Absent, Applied, Match, Rejected
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.boto_sends import BotoSends
from tests.helpers.s3_fake import FakeS3, StoredBody, etag_of

BUCKET = "classify"
KEY = "cells/Counter:a/own.json"


@pytest.fixture(params=["direct", "boto3"])
def fake_bucket(
    request: pytest.FixtureRequest,
) -> Iterator[Callable[[str], tuple[FakeS3, S3Bucket]]]:
    """Start a fake in the given mode with one empty bucket; stop them all afterwards."""
    fakes: list[FakeS3] = []
    sends: list[BotoSends] = []
    with contextlib.ExitStack() as counting:

        def make(mode: str) -> tuple[FakeS3, S3Bucket]:
            fake = FakeS3(mode).start()
            fakes.append(fake)
            fake.create_bucket(BUCKET)
            bucket = S3Bucket(BUCKET, endpoint=fake.endpoint, timeout=5.0)
            assert bucket._direct is not None
            if request.param == "boto3":
                bucket._direct = None
            else:  # every conditional PUT must have gone direct: count boto3's
                sends.append(counting.enter_context(BotoSends(bucket._cas)))
            return fake, bucket

        yield make
    for fake in fakes:
        fake.stop()
    assert [counter.count for counter in sends] == [0] * len(sends)


def _seed(fake: FakeS3, body: bytes) -> str:
    """Store ``body`` at KEY directly in the fake; return its quoted ETag."""
    with fake.lock:
        fake.buckets[BUCKET][KEY] = StoredBody(body, etag_of(body), 0.0)
    return etag_of(body)


def test_drop_after_commit_is_ambiguous_and_the_create_is_there(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("drop_after_commit")
    with pytest.raises(AmbiguousWrite):
        bucket.put_cas(KEY, b"created", Absent())
    got = bucket.get(KEY)
    assert got is not None and got.body == b"created"
    assert got.token == etag_of(b"created")
    assert len(fake.puts(KEY)) == 1, "a conditional PUT must not be retried by the client"


def test_drop_after_commit_of_an_update_is_ambiguous_and_applied(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("drop_after_commit")
    token = _seed(fake, b"v1")
    with pytest.raises(AmbiguousWrite):
        bucket.put_cas(KEY, b"v2", Match(token))
    got = bucket.get(KEY)
    assert got is not None and got.body == b"v2"
    assert len(fake.puts(KEY)) == 1


@pytest.mark.parametrize("guard_kind", ["absent", "match"])
def test_500_is_ambiguous_and_sent_once(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]], guard_kind: str
) -> None:
    fake, bucket = fake_bucket("error500")
    if guard_kind == "absent":
        guard: Absent | Match = Absent()
        before = None
    else:
        guard = Match(_seed(fake, b"v1"))
        before = b"v1"
    with pytest.raises(AmbiguousWrite, match="500"):
        bucket.put_cas(KEY, b"v2", guard)
    puts = fake.puts(KEY)
    assert len(puts) == 1, f"expected exactly one conditional PUT, saw {len(puts)}"
    assert puts[0].conditional and puts[0].status == 500
    got = bucket.get(KEY)
    assert (got.body if got else None) == before


def test_unquoted_only_store_applies_the_quoted_token_via_the_fallback(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("unquoted_only")
    created = bucket.put_cas(KEY, b"v1", Absent())
    assert isinstance(created, Applied)
    assert created.token == etag_of(b"v1")  # quoted, as S3 returns it

    result = bucket.put_cas(KEY, b"v2", Match(created.token))
    assert result == Applied(etag_of(b"v2"))
    got = bucket.get(KEY)
    assert got is not None and got.body == b"v2"
    # First the quoted spelling (412), then the bare one after the HEAD showed no change.
    puts = [p for p in fake.puts(KEY) if p.if_match is not None]
    assert [(p.if_match, p.status) for p in puts] == [
        (created.token, 412),
        (created.token.strip('"'), 200),
    ]


def test_unquoted_only_store_still_rejects_a_stale_token(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("unquoted_only")
    first = bucket.put_cas(KEY, b"v1", Absent())
    assert isinstance(first, Applied)
    second = bucket.put_cas(KEY, b"v2", Match(first.token))
    assert isinstance(second, Applied)
    puts_before = len(fake.puts(KEY))

    stale = bucket.put_cas(KEY, b"v3", Match(first.token))
    assert isinstance(stale, Rejected)
    got = bucket.get(KEY)
    assert got is not None and got.body == b"v2"
    # The HEAD showed another token, so the other spelling was never tried.
    assert len(fake.puts(KEY)) == puts_before + 1
    # A bare stale token is rejected as well.
    assert isinstance(bucket.put_cas(KEY, b"v4", Match(first.token.strip('"'))), Rejected)
    got = bucket.get(KEY)
    assert got is not None and got.body == b"v2"


@pytest.mark.parametrize("guard_kind", ["absent", "match"])
def test_409_conditional_request_conflict_is_rejected(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]], guard_kind: str
) -> None:
    fake, bucket = fake_bucket("conflict409")
    guard: Absent | Match = Absent() if guard_kind == "absent" else Match(_seed(fake, b"v1"))
    result = bucket.put_cas(KEY, b"v2", guard)
    assert result == Rejected("ConditionalRequestConflict")
    assert all(p.status == 409 for p in fake.puts(KEY))
    if guard_kind == "absent":
        assert len(fake.puts(KEY)) == 1


def test_enforcing_store_classifies_412_and_missing_key(
    fake_bucket: Callable[[str], tuple[FakeS3, S3Bucket]],
) -> None:
    fake, bucket = fake_bucket("enforce")
    missing = bucket.put_cas(KEY, b"v0", Match(etag_of(b"never")))
    assert missing == Rejected("missing")
    assert bucket.get(KEY) is None

    created = bucket.put_cas(KEY, b"v1", Absent())
    assert created == Applied(etag_of(b"v1"))
    again = bucket.put_cas(KEY, b"v1b", Absent())
    assert again == Rejected("PreconditionFailed")
    got = bucket.get(KEY)
    assert got is not None and got.body == b"v1"
    assert [p.status for p in fake.puts(KEY)] == [404, 200, 412]
