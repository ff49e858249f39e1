"""Fresh buckets on the loopback stores the tests start (names unique per process)."""

from __future__ import annotations

import itertools
import os

import boto3

from cellactors.persistence.store.s3 import S3Bucket

_names = itertools.count()


def new_bucket_name(tag: str = "t") -> str:
    return f"{tag}-{os.getpid()}-{next(_names)}"


def make_s3_bucket(endpoint: str, prefix: str = "") -> S3Bucket:
    """A fresh, empty bucket on ``endpoint``."""
    name = new_bucket_name()
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return S3Bucket(name, prefix, endpoint=endpoint)
