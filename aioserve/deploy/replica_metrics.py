"""One replica's engine stats as Ray metrics (exported in Prometheus format, tagged by replica),
beside Serve's own ``ray_serve_*``."""

from __future__ import annotations

from collections.abc import Mapping

from ray.util.metrics import Gauge

#: Engine stat -> (metric name, description).
EXPORTED: dict[str, tuple[str, str]] = {
    "num_running": ("aioserve_num_requests_running", "requests running in the engine"),
    "num_waiting": ("aioserve_num_requests_waiting", "requests waiting for a slot"),
    "kv_cache_usage": ("aioserve_kv_cache_usage", "fraction of KV blocks in use (0-1)"),
    "num_free_blocks": ("aioserve_kv_free_blocks", "free KV-cache blocks"),
    "num_preemptions": ("aioserve_num_preemptions", "preemptions since start"),
    "num_steps": ("aioserve_num_steps", "engine steps since start"),
}


class ReplicaMetrics:

    def __init__(self, replica: str) -> None:
        self.tags = {"replica": replica}
        self.gauges = {
            stat: Gauge(name, description, tag_keys=("replica",))
            for stat, (name, description) in EXPORTED.items()
        }

    def record(self, stats: Mapping[str, float]) -> None:
        """Set every gauge from :meth:`AsyncEngine.stats`."""
        for stat, gauge in self.gauges.items():
            gauge.set(float(stats[stat]), tags=self.tags)
