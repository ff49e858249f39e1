"""cellactors: durable, single-instance actors ("cells") with per-cell SQLite state, fenced
and replicated through an S3 or GCS bucket."""

__version__ = "0.1.0"
