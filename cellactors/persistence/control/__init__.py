"""The fleet's control records in the bucket: a cell's ownership record (``own.json``),
node leases, wake entries for alarms and outboxes, and the fleet's peer key. Each store
reads and conditionally writes its records through a bucket; the decisions about them are
in :mod:`cellactors.core`."""
