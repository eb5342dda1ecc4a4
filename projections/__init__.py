"""Projections: what each reads, its key, its targets, how it applies a batch, its oracle.

One projection per module (mirrors.py, changelog.py) or package (ledger/, views/,
event_time/, each with its `projection.py`), each readable on its own, each an instance
of the contract in sync/projection.py (`PROJECTION`). The commands find them in
sync/commands/__init__.py. A projection never imports a command, the command line or the
embedded stack: it runs the same on any deployment.
"""
