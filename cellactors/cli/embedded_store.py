"""The embedded single-machine store of ``serve`` and ``dev`` without ``--bucket``: a
SeaweedFS under the data directory, with a ``cellactors`` bucket in it."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from cellactors.cli.store_options import StoreArgs
from cellactors.persistence.store.bucket import Bucket

log = logging.getLogger("cellactors.serve")

EMBEDDED_BUCKET = "cellactors"
EMBEDDED_ACCESS_KEY = "cellactors"
EMBEDDED_SECRET_KEY = "cellactors-embedded-store"


def start_embedded_store(folder: Path, store: StoreArgs) -> tuple[Any, Bucket]:
    """Start SeaweedFS under ``folder`` and create the ``cellactors`` bucket in it; the
    server and the bucket. ``cellactors dev`` shares one such store between its nodes."""
    from cellactors.persistence.store.embedded import SeaweedServer
    from cellactors.persistence.store.s3 import S3Bucket

    # `weed mini` takes its S3 identity from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in its
    # environment: make them, and the keys this process signs with, the same pair.
    access = store.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID") or EMBEDDED_ACCESS_KEY
    secret = (
        store.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY") or EMBEDDED_SECRET_KEY
    )
    os.environ["AWS_ACCESS_KEY_ID"] = access
    os.environ["AWS_SECRET_ACCESS_KEY"] = secret
    server = SeaweedServer(folder).start()
    try:
        bucket = S3Bucket(
            EMBEDDED_BUCKET,
            endpoint=server.endpoint,
            region=store.region,
            access_key=access,
            secret_key=secret,
        )
        bucket.ensure_exists()
    except BaseException:
        server.stop()
        raise
    log.info("embedded store serving s3://%s at %s", EMBEDDED_BUCKET, server.endpoint)
    return server, bucket
