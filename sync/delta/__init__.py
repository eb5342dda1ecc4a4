"""Writing to Delta tables: idempotent commits and the newer-than MERGE."""
