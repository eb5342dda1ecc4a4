"""A Delta table's latest version read from its log's files (sync/delta/merge.py
`latest_version`): found again from where it was last found, from the last checkpoint
when that version's file is gone (the table was removed and made again)."""

import json
import shutil

from sync.delta import merge


def commits(log, versions, checkpoint=None):
    log.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": {"version": version}}) + "\n")
    if checkpoint is not None:
        (log / "_last_checkpoint").write_text(json.dumps({"version": checkpoint, "size": 1}))


def test_the_latest_version_is_found_from_the_last_one_found_and_after_the_table_is_made_again(tmp_path):
    table, log = str(tmp_path / "t"), tmp_path / "t" / "_delta_log"
    assert merge.latest_version(table) == 0  # no table yet
    commits(log, range(0, 13), checkpoint=10)
    assert merge.latest_version(table) == 12
    commits(log, [13, 14])
    assert merge.latest_version(table) == 14
    (log / "_last_checkpoint").unlink()  # (found from 14 on, not from the start)
    commits(log, [15])
    assert merge.latest_version(table) == 15
    shutil.rmtree(tmp_path / "t")  # removed and made again, with fewer versions
    commits(log, range(0, 3))
    assert merge.latest_version(table) == 2
    commits(log, range(3, 40))
    assert merge.latest_version(table) == 39
