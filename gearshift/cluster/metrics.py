"""Per-replica series on the server's /metrics: what each replica runs, queues and caches,
whether it is up, how often it restarted, and where the router sent requests.

    gearshift_replica_up{replica}                        1 serving, 0 restarting or gone
    gearshift_replica_num_requests_running{replica}
    gearshift_replica_num_requests_waiting{replica}
    gearshift_replica_kv_cache_usage_perc{replica}       held by running requests, 0..1
    gearshift_replica_kv_slots_free{replica} / _total / _cached
    gearshift_replica_prefix_cache_hit_rate{replica}
    gearshift_replica_restarts{replica}
    gearshift_router_requests_total{replica, reason}     reason: prefix | load

The unlabelled totals (gearshift_* and the router protocol's vllm:* names) add the live
replicas up: a picker in front of this server sees one endpoint.

Data flow: build_app registers ReplicaCollector(replica_set) -> GET /metrics -> collect().
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ReplicaCollector:
    def __init__(self, replica_set) -> None:
        self.replica_set = replica_set

    def collect(self):
        rs = self.replica_set
        gauges = {name: GaugeMetricFamily(f"gearshift_replica_{name}", text, labels=["replica"])
                  for name, text in (
                      ("up", "1 while the replica serves, 0 while it restarts or is gone"),
                      ("num_requests_running", "Requests running in the replica"),
                      ("num_requests_waiting", "Requests waiting in the replica"),
                      ("kv_cache_usage_perc", "KV slots held by running requests / all, 0..1"),
                      ("kv_slots_free", "Free KV slots of the replica"),
                      ("kv_slots_total", "KV slots of the replica"),
                      ("kv_slots_cached", "KV slots the replica's prefix cache holds"),
                      ("prefix_cache_hit_rate", "Prefix-cache hits / queries (tokens)"),
                      ("restarts", "Times the replica's actor was restarted"))}
        for r in rs.replicas:
            label = [str(r.index)]
            engine = r.engine
            up = engine.is_alive
            snap = engine.snapshot
            mem = snap.memory
            total = mem.get("kv_slots_total", 0)
            free, cached = mem.get("kv_slots_free", 0), mem.get("kv_slots_cached", 0)
            values = {"up": float(up), "restarts": r.restarts,
                      "num_requests_running": snap.num_running if up else 0,
                      "num_requests_waiting": engine.num_waiting if up else 0,
                      "kv_cache_usage_perc": (total - free - cached) / total if total else 0.0,
                      "kv_slots_free": free, "kv_slots_total": total, "kv_slots_cached": cached,
                      "prefix_cache_hit_rate": (snap.stats.get("prefix_cache") or {}).get(
                          "hit_rate", 0.0)}
            for name, value in values.items():
                gauges[name].add_metric(label, value)
        yield from gauges.values()
        routed = CounterMetricFamily("gearshift_router_requests",
                                     "Requests routed, by replica and reason (prefix | load)",
                                     labels=["replica", "reason"])
        for (index, reason), n in sorted(rs.routed.items()):
            routed.add_metric([str(index), reason], n)
        yield routed
