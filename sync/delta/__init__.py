"""Writing to Delta tables: idempotent commits and the newer-than MERGE; and reading them
without Spark (reader.py, for verify)."""
