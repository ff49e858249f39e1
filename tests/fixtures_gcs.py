"""GCS fixtures (fake-gcs-server); filled in by the GCS dialect work."""
