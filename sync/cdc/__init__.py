"""Debezium change events: their envelope, source positions and column types.

Imports no sink and no engine loop: what a change *is*, not where it goes.
"""
