"""``cellactors qualify`` (placeholder until the qualification module lands)."""
