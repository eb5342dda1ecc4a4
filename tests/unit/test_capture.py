"""`lakesync capture`: the capture set kept beside the setting, and a snapshot's progress
read from the connector's source offset (values as Debezium 3.5 writes them)."""

import json

import pytest

from sync import config
from sync.commands.capture import snapshots

# Debezium's serialized Object[]{Long} for the keys 237 and 10000, as a real offset held them.
KEY_237 = ("aced0005757200135b4c6a6176612e6c616e672e4f626a6563743b90ce589f1073296c0200007870000000017372000e"
           "6a6176612e6c616e672e4c6f6e673b8be490cc8f23df0200014a000576616c7565787200106a6176612e6c616e672e4e"
           "756d62657286ac951d0b94e08b020000787000000000000000ed")
KEY_10000 = KEY_237[:-16] + "0000000000002710"
RUNNING = {"lsn": 900, "incremental_snapshot_primary_key": KEY_237, "incremental_snapshot_maximum_key": KEY_10000,
           "incremental_snapshot_collections": json.dumps([{"incremental_snapshot_collections_id": "late.big",
                                                            "incremental_snapshot_collections_additional_condition":
                                                            None}])}


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    monkeypatch.delenv("LAKESYNC_CAPTURE", raising=False)
    return config.load()


def test_added_entries_join_the_setting(settings, monkeypatch):
    settings.capture_file.write_text(json.dumps({"added": ["late.big", "audit"]}))
    monkeypatch.setenv("LAKESYNC_CAPTURE", "public,audit")
    loaded = config.load()
    assert loaded.capture.texts() == ["public", "audit", "late.big"]
    assert loaded.capture_added == ("late.big", "audit")
    settings.capture_file.write_text("{not json")
    with pytest.raises(config.LakesyncError, match="capture.json cannot be read"):
        config.load()


def test_a_snapshot_is_requested_then_running_with_its_keys_then_done(settings):
    settings.capture_file.write_text(json.dumps({"snapshots": {
        "late.big": {"state": "signalled", "signal_lsn": 800},
        "late.other": {"state": "requested"},
        "late.text_key": {"state": "signalled", "signal_lsn": 1000}}}))
    text_key = {**RUNNING, "incremental_snapshot_primary_key": "aced0005" + "74" + "0003616263"}
    text_key["incremental_snapshot_collections"] = json.dumps([{"incremental_snapshot_collections_id": "late.text_key"}])
    assert snapshots(settings, RUNNING) == {"late.big": {"state": "running", "at_key": 237, "last_key": 10000},
                                            "late.other": {"state": "requested"},
                                            "late.text_key": {"state": "requested"}}  # signal not read yet
    assert snapshots(settings, text_key)["late.text_key"] == {"state": "running"}  # no integer key to show
    assert snapshots(settings, {"lsn": 1200})["late.big"] == {"state": "done"}
    assert snapshots(settings, {}) == {"late.big": {"state": "requested"}, "late.other": {"state": "requested"},
                                       "late.text_key": {"state": "requested"}}
