"""Fresh buckets on the loopback stores the tests start (names unique per process)."""

from __future__ import annotations

import itertools
import os

import boto3

from cellactors.persistence.store.embedded_keys import S3Credentials
from cellactors.persistence.store.s3 import S3Bucket

_names = itertools.count()


def new_bucket_name(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{next(_names)}"


def env_keys() -> S3Credentials:
    """The S3 keys of this environment (tests/conftest.py sets them), which the tests'
    clients sign with: the keys the embedded stores the tests start are given."""
    return S3Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])


def make_s3_bucket(endpoint: str, prefix: str = "") -> S3Bucket:
    """A fresh, empty bucket on ``endpoint``."""
    name = new_bucket_name()
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return S3Bucket(name, prefix, endpoint=endpoint)
