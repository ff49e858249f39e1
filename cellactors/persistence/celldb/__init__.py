"""A cell's local SQLite database: the database the cell's methods use (with the authorizer
that keeps user SQL off the runtime's tables), the capture of each transaction's changes,
the call log of idempotency keys, and the runtime's own tables (alarms, outbox, dead
letters)."""
