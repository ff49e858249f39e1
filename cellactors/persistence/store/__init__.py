"""The object store: the :class:`~cellactors.persistence.store.bucket.Bucket` interface and
its dialects (S3 through boto3 or the direct path, GCS, an in-memory double), the wrappers
every node puts in front of one (the fence gate, the request meter), bucket specs and the
factory that opens one, the strict JSON records stored in it, the embedded single-machine
store, and the probe that qualifies a store."""
