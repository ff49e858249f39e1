"""The embedded single-machine store of ``serve`` and ``dev`` without ``--bucket``: a
SeaweedFS under the data directory, with a ``cellactors`` bucket in it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from cellactors.cli.store_options import StoreArgs
from cellactors.persistence.store.bucket import Bucket

if TYPE_CHECKING:
    from cellactors.persistence.store.embedded import SeaweedServer

log = logging.getLogger("cellactors.serve")

EMBEDDED_BUCKET = "cellactors"


def start_embedded_store(folder: Path, store: StoreArgs) -> tuple[SeaweedServer, Bucket]:
    """Start SeaweedFS under ``folder`` and create the ``cellactors`` bucket in it; the
    server and the bucket. ``cellactors dev`` shares one such store between its nodes.

    The store's S3 key pair is the one given with ``--access-key-id``/``--secret-access-key``
    (both, or neither), else the one it keeps under ``folder/keys``, else a new one made and
    kept there; the node signs with it. ``AWS_*`` in the environment is not used."""
    from cellactors.errors import ConfigError
    from cellactors.persistence.store.embedded import SeaweedServer
    from cellactors.persistence.store.embedded_keys import S3Credentials
    from cellactors.persistence.store.s3 import S3Bucket

    given = None
    if store.access_key_id or store.secret_access_key:
        if not (store.access_key_id and store.secret_access_key):
            raise ConfigError(
                "the embedded store takes both --access-key-id and --secret-access-key, "
                "or neither (it then makes its own pair and keeps it)"
            )
        given = S3Credentials(store.access_key_id, store.secret_access_key)
    server = SeaweedServer(folder, credentials=given).start()
    try:
        bucket = S3Bucket(
            EMBEDDED_BUCKET,
            endpoint=server.endpoint,
            region=store.region,
            access_key=server.credentials.access_key_id,
            secret_key=server.credentials.secret_access_key,
        )
        bucket.ensure_exists()
    except BaseException:
        server.stop()
        raise
    log.info(
        "embedded store serving s3://%s at %s (its S3 keys in %s; its ports, all on loopback: %s)",
        EMBEDDED_BUCKET,
        server.endpoint,
        server.keys_dir,
        " ".join(f"{name}={port}" for name, port in sorted(server.ports.items())),
    )
    return server, bucket
