"""A cell's history in the bucket: change batches, epoch seals and snapshots, the restore
that rebuilds a database from them (to now or to a point), and the change feed that reads
them in order."""
