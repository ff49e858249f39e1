"""The persistence layer tells missing or refused credentials (StoreCredentialsError) and an
unreachable endpoint (StoreUnreachable) apart from other store failures, under real
conditions: an empty credential chain, a closed loopback port, keys the store refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cellactors.errors import (
    AmbiguousWrite,
    BucketError,
    StoreCredentialsError,
    StoreUnreachable,
)
from cellactors.persistence.store.bucket import Absent, Bucket
from cellactors.persistence.store.embedded import SeaweedServer, free_port
from cellactors.persistence.store.memory import MemoryBucket
from cellactors.persistence.store.s3 import S3Bucket
from tests.helpers.s3_fake import FakeS3


@pytest.fixture
def no_aws_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An AWS credential chain that finds nothing: no AWS_* keys, credential and config
    files that do not exist, no instance metadata."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def fake() -> Iterator[FakeS3]:
    server = FakeS3("enforce").start()
    server.create_bucket("errs")
    yield server
    server.stop()


@pytest.mark.usefixtures("no_aws_credentials")
def test_s3_without_credentials_is_a_credentials_error_and_sends_nothing(fake: FakeS3) -> None:
    bucket = S3Bucket("errs", endpoint=fake.endpoint)
    before = len(fake.requests)
    with pytest.raises(StoreCredentialsError, match="credentials"):
        bucket.get("nodes/a.json")
    with pytest.raises(StoreCredentialsError):  # never sent, so not AmbiguousWrite
        bucket.put_cas("probe/x", b"x", Absent())
    with pytest.raises(StoreCredentialsError):
        list(bucket.list("cells/"))
    assert len(fake.requests) == before


def test_s3_closed_port_is_unreachable_not_ambiguous() -> None:
    bucket = S3Bucket("errs", endpoint=f"http://127.0.0.1:{free_port()}", timeout=2.0)
    with pytest.raises(StoreUnreachable) as caught:
        bucket.put_cas("probe/x", b"x", Absent())
    assert not isinstance(caught.value, AmbiguousWrite)
    with pytest.raises(StoreUnreachable):
        bucket.get_once("nodes/a.json")


def test_s3_refused_keys_are_a_credentials_error(seaweed: SeaweedServer) -> None:
    """SeaweedFS checks the identity it was started with; other keys are refused (403)."""
    bucket = S3Bucket(
        "errs", endpoint=seaweed.endpoint, access_key="not-a-key", secret_key="not-a-secret"
    )
    with pytest.raises(StoreCredentialsError):
        bucket.get_once("nodes/a.json")


def test_s3_a_missing_bucket_is_an_error_not_a_missing_object(seaweed: SeaweedServer) -> None:
    """404 NoSuchBucket (a wrong name, a deleted bucket) must never read as "no such
    object": ``own.json`` or a lease would look absent."""
    bucket = S3Bucket("no-such-bucket-here", endpoint=seaweed.endpoint, timeout=3.0)
    with pytest.raises(BucketError, match="NoSuchBucket"):
        bucket.get("cells/Counter:a/own.json")
    with pytest.raises(BucketError, match="NoSuchBucket"):
        bucket.get_once("nodes/a.json")
    with pytest.raises(BucketError, match="NoSuchBucket"):
        bucket.delete("nodes/a.json")
    # (A HEAD answer has no body to tell a missing bucket from a missing key.)


def test_gcs_emulator_on_a_closed_port_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    from cellactors.persistence.store.gcs import EMULATOR_VAR, GcsBucket

    monkeypatch.setenv(EMULATOR_VAR, f"http://127.0.0.1:{free_port()}")
    bucket = GcsBucket("errs", timeout=2.0)
    with pytest.raises(StoreUnreachable) as caught:
        bucket.put_cas("probe/x", b"x", Absent())
    assert not isinstance(caught.value, AmbiguousWrite)
    with pytest.raises(StoreUnreachable):
        bucket.get_once("nodes/a.json")


def test_gcs_without_application_default_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cellactors.persistence.store.gcs import EMULATOR_VAR, GcsBucket

    monkeypatch.delenv(EMULATOR_VAR, raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # not on GCE: skip the metadata server
    with pytest.raises(StoreCredentialsError, match="Application Default Credentials"):
        GcsBucket("errs")


# --------------------------------------------------------------------------- list_folders


def _fill(bucket: Bucket, cells: list[str]) -> None:
    for cell in cells:
        bucket.put(f"cells/{cell}/own.json", b"{}")
        bucket.put(f"cells/{cell}/e1/0000000000000001-0000000000000001.batch", b"x")
    bucket.put("nodes/n.json", b"{}")


CELLS = ["A:b", "A:b.x", "A:b0", "A:c", "B:a"]


@pytest.mark.parametrize("dialect", ["s3", "gcs", "memory"])
def test_list_folders_pages_with_a_cursor(request: pytest.FixtureRequest, dialect: str) -> None:
    bucket: Bucket = MemoryBucket()
    if dialect != "memory":
        bucket = request.getfixturevalue("sw_bucket" if dialect == "s3" else "gcs_bucket")
    _fill(bucket, CELLS)
    everything = list(bucket.list_folders("cells/"))
    assert sorted(everything) == sorted(CELLS)  # each once, in the store's own order
    for i, cursor in enumerate(everything):  # any cursor resumes right after its folder
        assert list(bucket.list_folders("cells/", cursor)) == everything[i + 1 :]
