"""In-process fakes of external services, for tests that need a store to misbehave."""
