"""The benchmark's figures: ratios, goals, the JSON for machines, a markdown table and plots.

Pure functions of the measured figures (no stack, no Spark), so they are unit-tested.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

# The goals on two cores, and the published anchors quoted beside ours.
GOALS = {
    "capture_events_per_s": (">=", 10_000, "capture (Postgres commit -> Kafka)"),
    "apply_events_per_s": (">=", 20_000, "apply into a 1M-row mirror"),
    "freshness_p99_s": ("<=", 5.0, "freshness p99 at a steady rate"),
    "rebuild_events_per_s": (">=", 30_000, "rebuild from offset zero"),
    "merge_10m_vs_100k": (">=", 0.60, "merge rate at 10M rows / at 100k rows"),
    "ours_vs_peer": (">=", 2.0, "ours / hand-written peer (same records)"),
    "small_change_latency_p50_s": ("<=", 2.0, "one row committed on an idle stack until `wait` returns, p50"),
}
ANCHORS = [
    {"what": "Debezium Postgres capture, streaming, tuned Connect, 4 vCPU", "events_per_s": 45_000,
     "source": "ConduitIO streaming-benchmarks, May 2025"},
    {"what": "Debezium on MSK Connect, held throughput at 499 ms p99", "events_per_s": 6_000,
     "source": "Sequin performance page"},
]


def machine() -> dict:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": round(memory, 1),
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


def summarise(figures: dict) -> dict:
    """The figures with their ratios and each goal's verdict added."""
    merge = figures.get("merge_rate_by_rows", {})
    sizes = sorted(merge, key=int)
    cluster = figures.get("cluster") or {}  # step 6's figures (none when it was skipped)
    out = dict(figures)
    out["ratios"] = {
        "ours_vs_ceiling": ratio(figures.get("rebuild_events_per_s"), figures.get("ceiling_events_per_s")),
        "ours_vs_peer": ratio(figures.get("rebuild_events_per_s"), figures.get("peer_events_per_s")),
        "ours_vs_sdp": ratio(figures.get("rebuild_events_per_s"), figures.get("sdp_events_per_s")),
        "peer_vs_ceiling": ratio(figures.get("peer_events_per_s"), figures.get("ceiling_events_per_s")),
        "cluster_vs_local_apply": ratio(cluster.get("apply_events_per_s"), figures.get("apply_events_per_s")),
        "cluster_vs_local_rebuild": ratio(cluster.get("rebuild_events_per_s"), figures.get("rebuild_events_per_s")),
        "capture_vs_anchor_45k": ratio(figures.get("capture_events_per_s"), ANCHORS[0]["events_per_s"]),
        "merge_largest_vs_smallest": (ratio(merge[sizes[-1]]["events_per_s"], merge[sizes[0]]["events_per_s"])
                                      if len(sizes) > 1 else None),
    }
    measured = {**figures, "ours_vs_peer": out["ratios"]["ours_vs_peer"],
                "merge_10m_vs_100k": (ratio(merge["10000000"]["events_per_s"], merge["100000"]["events_per_s"])
                                      if "10000000" in merge and "100000" in merge else None)}
    out["goals"] = {}
    for key, (sense, target, what) in GOALS.items():
        value = measured.get(key)
        met = None if value is None else (value >= target if sense == ">=" else value <= target)
        out["goals"][key] = {"what": what, "target": f"{sense} {target:,}", "measured": value, "met": met,
                             "of_target": ratio(value, target)}
    out["anchors"] = ANCHORS
    return out


def markdown(result: dict) -> str:
    """The table README and docs/benchmark.md quote: each figure, its goal, and the ratios."""
    def num(value, unit=""):
        if value is None:
            return "n/a"
        return f"{value:,.0f}{unit}" if isinstance(value, (int, float)) and value >= 100 else f"{value}{unit}"

    m = result["machine"]
    lines = [f"Machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gib']} GiB, {m['system']}; "
             f"{result['events']:,} change events, taken {result['taken_at']}.", "",
             "| figure | measured | goal | met |", "|---|---|---|---|"]
    for key, goal in result["goals"].items():
        verdict = {True: "yes", False: "**no**", None: "n/a"}[goal["met"]]
        of = ""
        if goal["met"] is False:  # by how much
            of = (f" ({goal['of_target']:.0%} of the goal)" if goal["target"].startswith(">=")
                  else f" ({goal['of_target']:.1f}x the limit)")
        lines.append(f"| {goal['what']} | {num(goal['measured'])}{of} | {goal['target']} | {verdict} |")
    lines += ["", "| rate (change events/s) | measured |", "|---|---|"]
    for key in ("ceiling_events_per_s", "rebuild_events_per_s", "peer_events_per_s", "sdp_events_per_s"):
        lines.append(f"| {key} | {num(result.get(key))} |")
    cluster = result.get("cluster") or {}
    if "workers" in cluster:
        lines += [f"| on a standalone cluster of {cluster['workers']} one-core workers (this machine): {key} | "
                  f"{num(cluster.get(key))} |" for key in ("ceiling_events_per_s", "rebuild_events_per_s",
                                                              "apply_events_per_s")]
    for kind, figure in result.get("apply_by_kind", {}).items():
        lines.append(f"| apply, live runner catching up: {kind} | {num(figure.get('events_per_s'))} |")
    lines += ["", "| merge into a mirror of N rows | events/s | files |", "|---|---|---|"]
    for size, figure in sorted(result.get("merge_rate_by_rows", {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {int(size):,} | {num(figure['events_per_s'])} | {figure['files']} |")
    merges = sorted(result.get("merge_rate_by_rows", {}).items(), key=lambda kv: int(kv[0]))
    if merges and merges[-1][1].get("steps_seconds"):
        size, figure = merges[-1]
        lines += ["", f"Where a merge batch's time goes ({figure['batch_events']:,} changes into "
                      f"{int(size):,} rows; seconds per step of the mirrors' batch):", "",
                  "| step | seconds |", "|---|---|"]
        lines += [f"| {step} | {took} |" for step, took in figure["steps_seconds"].items()]
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [f"| {k} | {num(v)} |" for k, v in result["ratios"].items()]
    lines += ["", f"Freshness at {num(result.get('steady_events_per_s'))} events/s: p50 "
              f"{num(result.get('freshness_p50_s'))} s, p95 {num(result.get('freshness_p95_s'))} s, "
              f"p99 {num(result.get('freshness_p99_s'))} s over {result.get('freshness_samples', 0):,} events "
              f"(per event, into the changelog); capture's share (commit -> Kafka) p50 "
              f"{num(result.get('capture_delay_p50_s'))} s, p99 {num(result.get('capture_delay_p99_s'))} s; "
              f"the mirrors (each key's last change) p50 {num(result.get('freshness_mirrors_p50_s'))} s, "
              f"p99 {num(result.get('freshness_mirrors_p99_s'))} s."]
    if result.get("sdp_reason"):
        lines += ["", f"Spark Declarative Pipelines: {result['sdp_reason']}"]
    lines += ["", "Anchors: " + "; ".join(f"{a['what']}: {a['events_per_s']:,}/s ({a['source']})"
                                          for a in result["anchors"])]
    return "\n".join(lines) + "\n"


def write(result: dict, folder: Path, json_path: Path | None, delays: list[float]) -> list[Path]:
    """bench/results: the JSON, the markdown table and two plots; returns what it wrote."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path = json_path or folder / "bench.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = folder / "bench.md"
    table.write_text(markdown(result))
    return [json_path, table, *plots(result, folder, delays)]


def plots(result: dict, folder: Path, delays: list[float]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    if delays:
        figure, axis = plt.subplots(figsize=(7, 4))
        axis.hist(delays, bins=60, color="#4472c4")
        for q, style in ((50, "--"), (99, ":")):
            axis.axvline(percentile(delays, q), color="black", linestyle=style, label=f"p{q}")
        axis.set(xlabel="seconds from Postgres commit to Delta commit", ylabel="change events",
                 title=f"Freshness per event (into the changelog) at {result.get('steady_events_per_s', 0):,.0f} events/s")
        axis.legend()
        written.append(_save(figure, folder / "freshness.png"))
    merge = sorted(result.get("merge_rate_by_rows", {}).items(), key=lambda kv: int(kv[0]))
    if merge:
        figure, axis = plt.subplots(figsize=(7, 4))
        axis.plot([int(s) for s, _ in merge], [f["events_per_s"] for _, f in merge], marker="o")
        axis.set(xscale="log", xlabel="rows in the mirror", ylabel="change events/s",
                 title="Merge rate against table size (same batch)")
        axis.set_ylim(bottom=0)
        written.append(_save(figure, folder / "merge_scaling.png"))
    return written


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
