"""Lakesync: Postgres changes, captured by Debezium into Kafka, applied to Delta tables."""

__version__ = "0.1.0"
