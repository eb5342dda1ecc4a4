"""The runner's Prometheus metrics, served in the text format on LAKESYNC_METRICS_PORT.

Per projection (label `projection`; per table where a projection keeps several):

  lakesync_batch_duration_seconds        histogram of batch wall time, this run
  lakesync_rows_applied_total{table}     counter, rows each table's commits changed, this run
  lakesync_dead_letters_total{table}     counter, records set aside to the dead letters, this run
  lakesync_last_batch_timestamp_seconds  gauge, when its last batch committed (Unix time)
  lakesync_lag{unit}                     gauge, what its inputs hold that it has not read:
                                         Kafka records, or versions of its input Delta tables
  lakesync_freshness_seconds             gauge, it holds everything its inputs held this many
                                         seconds ago (0 while caught up)
  lakesync_up                            gauge, 1 while the sampler reads lag (0: Kafka unreachable)

Batch figures are recorded by the batch itself (sync/streaming/progress.py calls `observe_batch`).
Lag and freshness come from a sampler thread every SAMPLE_SECONDS, never from a scrape,
so a scrape is cheap and never waits on Kafka. Freshness is measured, not estimated: each
sample keeps the input end offsets of its moment, and a projection is as fresh as the
newest sample its checkpoint has passed, so the figure is exact to within one interval.
"""

from __future__ import annotations

import collections
import sys
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from sync.config import Settings
from sync.errors import LakesyncError
from sync.projection import Projection
from sync.streaming.offsets import input_ends, processed

SAMPLE_SECONDS = 5.0
KEPT_SAMPLES = 720  # an hour of samples: freshness beyond that reads as "at least an hour"

REGISTRY = CollectorRegistry()
BATCH_SECONDS = Histogram("lakesync_batch_duration_seconds", "Wall time of a projection's batch",
                          ["projection"], registry=REGISTRY,
                          buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600))
ROWS_APPLIED = Counter("lakesync_rows_applied", "Rows a projection's commits changed, per table",
                       ["projection", "table"], registry=REGISTRY)
DEAD_LETTERS = Counter("lakesync_dead_letters", "Records set aside to the dead letters, per table",
                       ["projection", "table"], registry=REGISTRY)
LAST_BATCH = Gauge("lakesync_last_batch_timestamp_seconds", "When the projection's last batch committed",
                   ["projection"], registry=REGISTRY)
LAG = Gauge("lakesync_lag", "Input the projection has not read yet", ["projection", "unit"], registry=REGISTRY)
FRESHNESS = Gauge("lakesync_freshness_seconds", "The projection holds everything its inputs held this long ago",
                  ["projection"], registry=REGISTRY)
UP = Gauge("lakesync_up", "1 while the sampler can read the inputs' end offsets", registry=REGISTRY)


class MetricsPortInUse(LakesyncError):
    exit_code = 2


def observe_batch(projection: str, seconds: float, applied: dict[str, int], dead: dict[str, int]) -> None:
    BATCH_SECONDS.labels(projection).observe(seconds)
    LAST_BATCH.labels(projection).set(time.time())
    for table, rows in applied.items():
        ROWS_APPLIED.labels(projection, table).inc(rows)
    for table, count in dead.items():
        DEAD_LETTERS.labels(projection, table).inc(count)


def freshness(samples, done: dict, now: float) -> float:
    """Seconds since the newest sample whose end offsets `done` has reached.

    `samples` are (time, ends) pairs, oldest first; with none reached, the oldest
    sample's age (a lower bound)."""
    for taken, ends in reversed(samples):
        if all(done.get(part, 0) >= end for part, end in ends.items()):
            return max(0.0, now - taken)
    return max(0.0, now - samples[0][0]) if samples else 0.0


class Sampler(threading.Thread):
    """Every SAMPLE_SECONDS: each projection's input end offsets and checkpoint position."""

    def __init__(self, settings: Settings, projections: list[Projection]):
        super().__init__(name="lakesync-metrics", daemon=True)
        self.settings, self.projections = settings, projections
        self.samples = {p.name: collections.deque(maxlen=KEPT_SAMPLES) for p in projections}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                for projection in self.projections:
                    now = time.time()
                    ends, done = input_ends(self.settings, projection), processed(self.settings, projection)
                    self.samples[projection.name].append((now, ends))
                    LAG.labels(projection.name, projection.source(self.settings).unit).set(
                        sum(max(0, end - done.get(part, 0)) for part, end in ends.items()))
                    FRESHNESS.labels(projection.name).set(freshness(self.samples[projection.name], done, now))
                UP.set(1)
            except Exception as error:  # Kafka restarting, a checkpoint file being replaced:
                UP.set(0)               # the next sample tries again; the sampler never dies
                print(f"lakesync metrics: sample failed ({type(error).__name__}: {error})", file=sys.stderr)
            self.stopped.wait(SAMPLE_SECONDS)


def serve(settings: Settings, projections: list[Projection]) -> Sampler | None:
    """Start the endpoint (http://127.0.0.1:<port>/metrics) and the sampler; None when off."""
    if not settings.metrics_port:
        return None
    try:
        start_http_server(settings.metrics_port, addr="127.0.0.1", registry=REGISTRY)
    except OSError as error:
        raise MetricsPortInUse(f"cannot serve metrics on 127.0.0.1:{settings.metrics_port} ({error.strerror}); "
                               "stop what holds it, or set LAKESYNC_METRICS_PORT (`off` disables)") from None
    sampler = Sampler(settings, projections)
    sampler.start()
    return sampler
