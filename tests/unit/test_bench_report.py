"""The benchmark's pure parts: skewed keys, percentiles, ratios, goals and the table."""

import json
import random

from sync.bench import report
from sync.bench.workload import hot


def test_hot_keys_are_distinct_in_range_and_skewed_to_the_newest():
    keys = hot(random.Random(3), 1, 1000, 200)
    assert len(keys) == len(set(keys)) and all(1 <= k <= 1000 for k in keys)
    draws = [hot(random.Random(seed), 1, 1000, 1)[0] for seed in range(400)]
    assert sum(k > 900 for k in draws) > sum(k <= 100 for k in draws) * 3
    assert hot(random.Random(1), 5, 4, 3) == []
    assert set(hot(random.Random(1), 1, 3, 10)) <= {1, 2, 3}


def test_percentile_interpolates_between_ranks():
    assert report.percentile([], 50) is None
    assert report.percentile([4.0], 99) == 4.0
    assert report.percentile([1, 2, 3, 4], 50) == 2.5
    assert report.percentile(list(range(101)), 99) == 99


FIGURES = {
    "machine": {"cpus": 2, "cpu_model": "x", "memory_gib": 24.0, "system": "Linux"},
    "events": 1000, "taken_at": "2026-11-23T12:00:00+00:00",
    "capture_events_per_s": 12_000, "ceiling_events_per_s": 100_000, "rebuild_events_per_s": 25_000,
    "peer_events_per_s": 10_000, "sdp_events_per_s": None, "sdp_reason": "not here",
    "apply_events_per_s": 8_000, "freshness_p50_s": 1.2, "freshness_p95_s": 2.0, "freshness_p99_s": 6.5,
    "steady_events_per_s": 990, "freshness_samples": 100,
    "merge_rate_by_rows": {"100000": {"events_per_s": 10_000, "files": 1},
                           "10000000": {"events_per_s": 5_000, "files": 40, "batch_events": 500,
                                        "steps_seconds": {"read": 0.5, "merge": 2.25}}},
    "cluster": {"workers": 2, "cores": 2, "master": "spark://127.0.0.1:22077", "ceiling_events_per_s": 50_000,
                "rebuild_events_per_s": 20_000, "apply_events_per_s": 6_000},
}


def test_summary_has_every_design_key_ratio_and_verdict():
    result = report.summarise(FIGURES)
    for key in ("machine", "capture_events_per_s", "apply_events_per_s", "ceiling_events_per_s",
                "peer_events_per_s", "freshness_p50_s", "freshness_p99_s", "rebuild_events_per_s",
                "merge_rate_by_rows"):
        assert key in result
    assert result["ratios"]["ours_vs_ceiling"] == 0.25
    assert result["ratios"]["ours_vs_peer"] == 2.5
    assert result["ratios"]["ours_vs_sdp"] is None
    assert result["ratios"]["merge_largest_vs_smallest"] == 0.5
    assert result["ratios"]["cluster_vs_local_apply"] == 0.75
    assert result["ratios"]["cluster_vs_local_rebuild"] == 0.8
    skipped = report.summarise({**FIGURES, "cluster": {"skipped": "--workers 0"}})
    assert skipped["ratios"]["cluster_vs_local_apply"] is None
    goals = result["goals"]
    assert goals["capture_events_per_s"]["met"] is True
    assert goals["freshness_p99_s"]["met"] is False
    assert goals["merge_10m_vs_100k"] == {"what": goals["merge_10m_vs_100k"]["what"], "target": ">= 0.6",
                                          "measured": 0.5, "met": False, "of_target": 0.833}
    assert goals["ours_vs_peer"]["met"] is True
    json.dumps(result)  # the JSON file is this, as is


def test_markdown_names_each_goal_and_what_could_not_run(tmp_path):
    result = report.summarise(FIGURES)
    text = report.markdown(result)
    assert "| freshness p99 at a steady rate | 6.5 (1.3x the limit) | <= 5.0 | **no** |" in text
    assert "| merge rate at 10M rows / at 100k rows | 0.5 (83% of the goal) | >= 0.6 | **no** |" in text
    assert "| 10,000,000 | 5,000 | 40 |" in text
    assert "Spark Declarative Pipelines: not here" in text
    assert "| merge | 2.25 |" in text
    assert "| on a standalone cluster of 2 one-core workers (this machine): apply_events_per_s | 6,000 |" in text
    assert "one-core workers" not in report.markdown(report.summarise({**FIGURES, "cluster": {"skipped": "x"}}))
    written = report.write(result, tmp_path, None, [0.5, 1.0, 1.5, 7.0])
    assert {p.name for p in written} == {"bench.json", "bench.md", "freshness.png", "merge_scaling.png"}
    assert json.loads((tmp_path / "bench.json").read_text())["ratios"]["ours_vs_peer"] == 2.5
