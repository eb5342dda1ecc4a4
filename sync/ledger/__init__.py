"""The ledger: its hash chain (chain.py) and the auditor's commands (audit.py).

Neither module needs Spark: the chain is plain Python, shared by the projection that
writes the ledger and the auditor who checks it, and the auditor reads the Delta table
with delta-rs, so `lakesync ledger ...` starts in a second and only ever reads.
"""

# Where the ledger projection keeps its tables, under the lake (any Delta reader can open them).
LEDGER = "ledger"
BALANCES = "ledger_balances"
