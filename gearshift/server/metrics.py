"""Prometheus metrics of one server: request counts by status, latency histograms, queue and
KV-slot gauges. Each app owns its registry, so several apps (tests) never collide.

Data flow: request handlers -> ServerMetrics.observe_* ; GET /metrics ->
ServerMetrics.render(snapshot of the AsyncEngine) -> Prometheus text.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from gearshift.frontend.async_engine import EngineSnapshot
from gearshift.server.router_metrics import RouterGauges

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gearshift_requests", "HTTP requests to the API by endpoint and status code",
            ["endpoint", "status"], registry=r,
        )
        self.finished = Counter(
            "gearshift_request_finish", "Generations finished, by finish reason",
            ["reason"], registry=r,
        )
        self.prompt_tokens = Counter(
            "gearshift_prompt_tokens", "Prompt tokens of accepted requests", registry=r
        )
        self.generation_tokens = Counter(
            "gearshift_generation_tokens", "Tokens generated", registry=r
        )
        self.ttft = Histogram(
            "gearshift_time_to_first_token_seconds", "Time to first token",
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.tpot = Histogram(
            "gearshift_time_per_output_token_seconds",
            "Mean time per output token after the first", buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "gearshift_e2e_request_latency_seconds", "End-to-end generation latency",
            buckets=_E2E_BUCKETS, registry=r,
        )
        self.running = Gauge(
            "gearshift_num_requests_running", "Requests running in the engine", registry=r
        )
        self.waiting = Gauge(
            "gearshift_num_requests_waiting", "Requests waiting for admission", registry=r
        )
        self.kv_free = Gauge("gearshift_kv_slots_free", "Free KV cache slots", registry=r)
        self.kv_total = Gauge("gearshift_kv_slots_total", "Total KV cache slots", registry=r)
        self.kv_cached = Gauge(
            "gearshift_kv_slots_cached", "KV slots held by the prefix cache", registry=r
        )
        self.cache_queries = Counter(
            "gearshift_prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache",
            registry=r)
        self.cache_hits = Counter(
            "gearshift_prefix_cache_hits_tokens", "Prompt tokens served from the prefix cache",
            registry=r)
        self.cache_hit_rate = Gauge(
            "gearshift_prefix_cache_hit_rate", "Prefix-cache hits / queries (tokens) so far",
            registry=r)
        self._cache_seen = (0, 0)
        self.tp_size = Gauge("gearshift_tensor_parallel_size",
                             "Ranks (GPUs) the model is split over", registry=r)
        self.kv_bytes_per_rank = Gauge(
            "gearshift_kv_cache_bytes_per_rank",
            "KV cache bytes of each rank (its KV heads over every slot)", registry=r)
        self.engine_stats = Gauge(
            "gearshift_engine_stat", "Engine counters (Engine.stats()) by name", ["name"],
            registry=r,
        )
        self.request_steps_by_k = Gauge(
            "gearshift_spec_request_steps", "Request-steps of VERIFY steps by the draft length "
            "K each request was given (0: it decoded plainly in that step)", ["k"], registry=r,
        )
        # per proposer (a hybrid, eagle3+suffix, has two): drafts, proposed / accepted tokens
        self.proposer_tokens = Gauge(
            "gearshift_spec_proposer_tokens", "Draft tokens by proposer: proposed (sent to "
            "verification) and accepted", ["proposer", "kind"], registry=r,
        )
        self.proposer_drafts = Gauge(
            "gearshift_spec_proposer_drafts", "Request-steps each proposer drafted for",
            ["proposer"], registry=r,
        )
        self.router_gauges = RouterGauges(r)  # the names outside routers read

    def observe_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()

    def observe_generation(
        self, *, arrival: float, first_token: float | None, end: float, num_tokens: int,
        finish_reason: str | None,
    ) -> None:
        """One finished choice: its times are time.monotonic() values."""
        self.finished.labels(reason=finish_reason or "none").inc()
        self.generation_tokens.inc(num_tokens)
        self.e2e.observe(end - arrival)
        if first_token is not None:
            self.ttft.observe(first_token - arrival)
            if num_tokens > 1:
                self.tpot.observe((end - first_token) / (num_tokens - 1))

    def render(self, snapshot: EngineSnapshot, num_waiting: int) -> bytes:
        self.running.set(snapshot.num_running)
        self.waiting.set(num_waiting)
        self.router_gauges.update(snapshot, num_waiting)
        mem = snapshot.memory
        self.kv_free.set(mem.get("kv_slots_free", 0))
        self.kv_total.set(mem.get("kv_slots_total", 0))
        self.kv_cached.set(mem.get("kv_slots_cached", 0))
        self.tp_size.set(mem.get("tensor_parallel_size", 1))
        self.kv_bytes_per_rank.set(mem.get("kv_cache_bytes_per_rank", 0))
        cache = snapshot.stats.get("prefix_cache") or {}
        if cache:  # the engine's running totals, as counter increments
            q, h = cache["queries_tokens"], cache["hit_tokens"]
            self.cache_queries.inc(max(0, q - self._cache_seen[0]))
            self.cache_hits.inc(max(0, h - self._cache_seen[1]))
            self._cache_seen = (q, h)
            self.cache_hit_rate.set(cache["hit_rate"])
        spec = snapshot.stats.get("spec") or {}
        for k, n in spec.get("steps_by_k", {}).items():
            self.request_steps_by_k.labels(k=str(k)).set(n)
        for name, own in spec.get("proposers", {}).items():
            for kind in ("proposed", "accepted"):
                if kind in own:
                    self.proposer_tokens.labels(proposer=name, kind=kind).set(own[kind])
            if "drafts" in own:
                self.proposer_drafts.labels(proposer=name).set(own["drafts"])
        for name, value in _flatten(snapshot.stats):
            self.engine_stats.labels(name=name).set(value)
        return generate_latest(self.registry)


def _flatten(stats: dict, prefix: str = "") -> list[tuple[str, float]]:
    """Numeric leaves of Engine.stats(); nested dicts (e.g. steps by K) as 'key.subkey'."""
    rows: list[tuple[str, float]] = []
    for key, value in stats.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += _flatten(value, name + ".")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            rows.append((name, value))
    return rows
