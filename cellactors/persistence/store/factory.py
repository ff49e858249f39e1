"""Turn a bucket spec plus options into a :class:`Bucket` of the right dialect.

Dialect rules that are easy to get wrong live here: a ``gs://`` bucket refuses an S3
endpoint and S3 static credentials (a startup error, never a silent fallback) and ignores
the region.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from cellactors.errors import ConfigError
from cellactors.persistence.store.bucket import Bucket
from cellactors.persistence.store.spec import BucketSpec, parse_bucket_spec

_S3_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class StoreOptions:
    """Connection options beside the spec. ``access_key``/``secret_key`` are S3 static
    credentials given to cellactors itself (flags or ``CELLACTORS_S3_*``)."""

    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    timeout: float = 10.0


def s3_endpoint_from_env(env: Mapping[str, str]) -> str | None:
    """The S3 endpoint boto3 would pick up from the environment, if any."""
    found = _s3_endpoint_var(env)
    return env[found] if found else None


def _s3_endpoint_var(env: Mapping[str, str]) -> str | None:
    for var in _S3_ENDPOINT_VARS:
        if env.get(var):
            return var
    return None


def check_options(spec: BucketSpec, options: StoreOptions, env: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` for option combinations the dialect forbids."""
    if spec.is_gcs:
        if options.endpoint:
            raise ConfigError(
                f"{spec} is a GCS bucket: an S3 endpoint ({options.endpoint}) cannot be used "
                "with it; drop --endpoint"
            )
        env_var = _s3_endpoint_var(env)
        if env_var:
            raise ConfigError(
                f"{spec} is a GCS bucket but an S3 endpoint is set in the environment "
                f"({env_var}={env[env_var]}); unset {env_var}"
            )
        if options.access_key or options.secret_key:
            raise ConfigError(
                f"{spec} is a GCS bucket: S3 static credentials are not accepted for it; "
                "GCS uses Application Default Credentials"
            )
    elif bool(options.access_key) != bool(options.secret_key):
        raise ConfigError("S3 static credentials need both an access key and a secret key")


_open_lock = threading.Lock()


def open_bucket(
    spec: str | BucketSpec,
    options: StoreOptions | None = None,
    env: Mapping[str, str] | None = None,
) -> Bucket:
    """Validate ``spec`` and ``options`` and return a bucket of the spec's dialect."""
    parsed = parse_bucket_spec(spec) if isinstance(spec, str) else spec
    opts = options or StoreOptions()
    environ = os.environ if env is None else env
    check_options(parsed, opts, environ)
    with _open_lock:
        if parsed.is_gcs:
            from cellactors.persistence.store.gcs import GcsBucket

            return GcsBucket(parsed.bucket, parsed.prefix, timeout=opts.timeout)
        from cellactors.persistence.store.s3 import S3Bucket

        return S3Bucket(
            parsed.bucket,
            parsed.prefix,
            endpoint=opts.endpoint or s3_endpoint_from_env(environ),
            region=opts.region,
            access_key=opts.access_key,
            secret_key=opts.secret_key,
            timeout=opts.timeout,
        )
