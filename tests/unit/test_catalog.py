"""The catalog readers resolve projections through, what `rebuild NAME` accepts, and its progress line."""

from pathlib import Path

import pytest

from projections import mirrors
from projections.views import projection as views
from sync import config
from sync.commands import all_projections, projection_named
from sync.commands.rebuild import projection_of
from sync.delta import catalog
from sync.errors import LakesyncError


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKESYNC_HOME", str(tmp_path))
    return config.load()


def test_generation_zero_is_the_lake_itself(settings):
    assert catalog.entry(settings, "mirrors")["generation"] == 0
    assert mirrors.mirror_path(settings, "orders") == settings.lake / "mirrors" / "orders"
    assert catalog.checkpoint(settings, "mirrors") == settings.lake / "_checkpoints" / "mirrors"


def test_a_rebuild_writes_its_generation_and_reads_the_rest_through_the_catalog(settings):
    shadow = catalog.building(settings, "views", 1)
    folder = settings.lake / "_generations" / "views" / "1"
    assert Path(views.PROJECTION.targets(shadow)[0].table).parent == folder
    assert catalog.checkpoint(shadow, "views") == folder / "_checkpoints" / "views"
    # Its inputs are the live ones, and it pushes nothing to the live search index.
    assert views.PROJECTION.source(shadow) == views.PROJECTION.source(settings)
    assert shadow.search_url == "" and shadow.metrics_port == 0


def test_swap_repoints_every_reader_and_retire_removes_only_that_projections_parts(settings):
    for part in ("mirrors/orders/_delta_log", "tombstones/orders", "_checkpoints/mirrors/commits",
                 "_fencing/mirrors", "changelog/_delta_log", "_checkpoints/changelog"):
        (settings.lake / part).mkdir(parents=True)
    (settings.lake / "_progress").mkdir()
    (settings.lake / "_progress" / "mirrors.json").write_text("{}")
    folder = catalog.root(catalog.building(settings, "mirrors", 1), "mirrors")
    old = catalog.swap(settings, "mirrors", 1, folder)
    assert old["generation"] == 0
    assert mirrors.mirror_path(settings, "orders") == folder / "mirrors" / "orders"
    catalog.retire(settings, mirrors.PROJECTION, old)
    gone = ["mirrors/orders", "tombstones", "_checkpoints/mirrors", "_fencing/mirrors", "_progress/mirrors.json"]
    assert not any((settings.lake / part).exists() for part in gone)
    assert (settings.lake / "changelog" / "_delta_log").is_dir() and (settings.lake / "_checkpoints" / "changelog").is_dir()
    # A later generation is one directory of its own: retiring it removes all of it.
    (folder / "mirrors").mkdir(parents=True)
    newer = catalog.root(catalog.building(settings, "mirrors", 2), "mirrors")
    catalog.retire(settings, mirrors.PROJECTION, catalog.swap(settings, "mirrors", 2, newer))
    assert not folder.exists() and catalog.entry(settings, "mirrors")["generation"] == 2


def test_a_swap_cut_short_before_retiring_the_old_generation_is_finished_by_the_next_start_or_swap(settings):
    """A process that dies between pointing the catalog at the new generation and retiring
    the old one (the runner's swap, the rebuild's own) leaves the old one named in the
    catalog's entry: the runner's start (`retire_replaced`) or the next swap retires it."""
    (settings.lake / "mirrors" / "orders" / "_delta_log").mkdir(parents=True)
    (settings.lake / "_checkpoints" / "mirrors").mkdir(parents=True)
    folders = {n: catalog.root(catalog.building(settings, "mirrors", n), "mirrors") for n in (1, 2, 3)}
    for folder in folders.values():
        (folder / "mirrors").mkdir(parents=True)
    catalog.swap(settings, "mirrors", 1, folders[1])  # and the process dies
    assert catalog.entry(settings, "mirrors")["replaced"] == {"generation": 0, "root": str(settings.lake)}
    assert (settings.lake / "mirrors" / "orders").is_dir()
    said = []
    catalog.retire_replaced(settings, mirrors.PROJECTION, said.append)
    catalog.retire_replaced(settings, mirrors.PROJECTION, said.append)  # nothing left to do
    assert said == ["swap: mirrors generation 0 retired"]
    assert not (settings.lake / "mirrors" / "orders").exists() and not (settings.lake / "_checkpoints" / "mirrors").exists()
    assert "replaced" not in catalog.entry(settings, "mirrors") and folders[1].is_dir()
    catalog.swap(settings, "mirrors", 2, folders[2])  # cut short again; then a whole swap
    said.clear()
    catalog.swap_in(settings, mirrors.PROJECTION, 3, folders[3], said.append)
    assert said == ["swap: mirrors generation 1 retired", "swap: the catalog now points mirrors at generation 3",
                    "swap: mirrors generation 2 retired"]
    assert not folders[1].exists() and not folders[2].exists() and folders[3].is_dir()
    assert catalog.entry(settings, "mirrors")["generation"] == 3 and "replaced" not in catalog.entry(settings, "mirrors")


@pytest.mark.parametrize("name,projection", [("mirrors", "mirrors"), ("mirror.orders", "mirrors"),
                                             ("ledger", "ledger"), ("ledger.balances", "ledger"),
                                             ("ledger.enriched", "views"), ("view.order_docs", "views"),
                                             ("history.customers", "views"), ("views", "views"),
                                             ("event_time", "event_time"), ("window.account_hourly", "event_time"),
                                             ("join.order_payments", "event_time"), ("late.event_time", "event_time"),
                                             ("event_time.inputs", "event_time")])
def test_rebuild_takes_a_projection_or_one_of_its_targets(settings, name, projection):
    assert projection_of(settings, name).name == projection


def test_wait_takes_any_projection_the_changelog_too(settings):
    assert projection_named(settings, "changelog", "wait for").name == "changelog"
    assert projection_named(settings, "mirror.Note Text", "wait for").name == "mirrors"


def test_lakesync_projections_names_what_runs(settings, monkeypatch):
    """On a team's own database the demo's projections (ledger, views, event time) stay off."""
    monkeypatch.setenv("LAKESYNC_PROJECTIONS", "mirrors, changelog")
    own = config.load()
    assert [p.name for p in all_projections(own)] == ["mirrors", "changelog"]
    assert projection_named(own, "mirror.orders", "wait for") is mirrors.PROJECTION
    with pytest.raises(LakesyncError, match="no projection or target named 'history.customers'"):
        projection_named(own, "history.customers", "wait for")
    assert [p.name for p in all_projections(settings)] == list(config.PROJECTIONS)
    for names, message in [("mirrors,views", "views reads changelog, ledger: name them too"),
                           ("mirrors,ledgers", "no projection named ledgers; known: mirrors, changelog")]:
        monkeypatch.setenv("LAKESYNC_PROJECTIONS", names)
        with pytest.raises(LakesyncError, match=message):
            all_projections(config.load())


@pytest.mark.parametrize("name,message", [("changelog", "bronze record"), ("orders", "no projection or target")])
def test_rebuild_refuses_the_changelog_and_unknown_names(settings, name, message):
    with pytest.raises(LakesyncError, match=message):
        projection_of(settings, name)


def test_the_progress_line_counts_what_this_run_read_towards_its_goal():
    from sync.commands.rebuild import _Progress

    goal = {("t", 0): 600, ("t", 1): 400}
    progress = _Progress("mirrors", "offsets", goal, {("t", 0): 100})
    line = progress.line({("t", 0): 700, ("t", 1): 150})  # past the goal counts as the goal
    assert line.startswith("mirrors 750/1,000 offsets (75 %) ") and "ETA" in line
    summary = progress.summary({("t", 0): 600, ("t", 1): 400})
    assert summary.startswith("  mirrors: 900 offsets read in ") and summary.endswith("at 1,000 of 1,000")


def test_mirror_names_never_collide_across_schemas(settings):
    """A public table's mirror keeps the table's name (mirror.orders), another schema's is
    schema.table, so inventory.orders and orders are two mirrors in two folders."""
    assert mirrors.table_of("lakesync.public.orders") == "orders"
    assert mirrors.table_of("lakesync.inventory.orders") == "inventory.orders"
    assert mirrors.source_table("orders") == ("public", "orders")
    assert mirrors.source_table("inventory.orders") == ("inventory", "orders")
    target = mirrors.target(settings, "inventory.orders")
    assert (target.name, target.source) == ("mirror.inventory.orders", "inventory.orders")
    assert target.oracle_sql == 'SELECT * FROM "inventory"."orders"'
    assert mirrors.mirror_path(settings, "inventory.orders") != mirrors.mirror_path(settings, "orders")
    assert mirrors.target(settings, 'it"s').oracle_sql == 'SELECT * FROM "public"."it""s"'
    assert projection_named(settings, "mirror.inventory.orders", "wait") is mirrors.PROJECTION


def test_the_mirrors_follow_every_captured_table_topic_and_no_other():
    import re

    pattern = re.compile(mirrors.TOPIC_PATTERN)  # Kafka matches a subscription pattern whole
    for topic in ("lakesync.public.orders", "lakesync.inventory.orders", "lakesync.billing.invoice_lines",
                  mirrors.DROPS_TOPIC):
        assert pattern.fullmatch(topic), topic
    for topic in ("lakesync.lakesync.heartbeat", "lakesync.events.account", "lakesync.public.a.b",
                  "lakesync.transaction", "__debezium-heartbeat.lakesync", "other.public.orders"):
        assert not pattern.fullmatch(topic), topic
