"""Everything that touches the bucket: dialects, specs, stores, batches, snapshots, restore."""

from cellactors.persistence.store.bucket import (
    Absent,
    Applied,
    Bucket,
    CasResult,
    Guard,
    Match,
    ObjectInfo,
    Rejected,
    StoredObject,
)
from cellactors.persistence.store.factory import StoreOptions, open_bucket
from cellactors.persistence.store.spec import BucketSpec, parse_bucket_spec

__all__ = [
    "Absent",
    "Applied",
    "Bucket",
    "BucketSpec",
    "CasResult",
    "Guard",
    "Match",
    "ObjectInfo",
    "Rejected",
    "StoreOptions",
    "StoredObject",
    "open_bucket",
    "parse_bucket_spec",
]
