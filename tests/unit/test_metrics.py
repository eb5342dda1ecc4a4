"""The runner's metrics: freshness from samples, and the text a scrape gets."""

from prometheus_client import generate_latest

from sync.streaming import metrics


def test_freshness_is_the_age_of_the_newest_sample_reached():
    samples = [(100.0, {("t", 0): 10}), (105.0, {("t", 0): 20}), (110.0, {("t", 0): 30})]
    assert metrics.freshness(samples, {("t", 0): 30}, now=112.0) == 2.0   # caught up with the last sample
    assert metrics.freshness(samples, {("t", 0): 25}, now=112.0) == 7.0   # holds what Kafka held at 105
    assert metrics.freshness(samples, {("t", 0): 5}, now=112.0) == 12.0   # none reached: the oldest's age
    assert metrics.freshness([], {}, now=112.0) == 0.0


def test_every_partition_must_be_reached():
    samples = [(100.0, {("a", 0): 10, ("b", 0): 10})]
    assert metrics.freshness(samples, {("a", 0): 10, ("b", 0): 10}, now=101.0) == 1.0
    samples.append((104.0, {("a", 0): 12, ("b", 0): 10}))
    assert metrics.freshness(samples, {("a", 0): 11, ("b", 0): 10}, now=106.0) == 6.0


def test_a_batch_shows_in_the_scrape():
    metrics.observe_batch("unit_test", 1.5, {"customers": 7}, {"customers": 1})
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'lakesync_rows_applied_total{projection="unit_test",table="customers"} 7.0' in text
    assert 'lakesync_dead_letters_total{projection="unit_test",table="customers"} 1.0' in text
    assert 'lakesync_batch_duration_seconds_count{projection="unit_test"} 1.0' in text
