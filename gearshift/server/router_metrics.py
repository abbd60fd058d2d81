"""The gauges that routers in front of model servers scrape, under the names they read by
default: the Gateway API inference extension's endpoint picker (and llm-d, built on it)
scores endpoints by queue depth, running requests and KV-cache usage, and sizes its
prefix-cache index by the engine's block size; NVIDIA Dynamo reads the same family.

    vllm:num_requests_waiting     gauge   requests queued (not yet admitted)
    vllm:num_requests_running     gauge   requests in the running batch
    vllm:kv_cache_usage_perc      gauge   KV slots held by running requests / all, 0..1
    vllm:gpu_cache_usage_perc     gauge   the same, the name older pickers read
    vllm:cache_config_info        info    labels block_size (the KV-event block, in tokens:
                                          our cache itself is token-granular) and
                                          num_gpu_blocks (KV slots / block_size)
    vllm:lora_requests_info       info    labels max_lora "0", running_lora_adapters "",
                                          waiting_lora_adapters "" (no LoRA: every replica
                                          is as good as any other for any adapter);
                                          value: the time of the scrape

Gearshift's own names (gearshift_*) carry the same numbers; these exist so that a picker
needs no per-engine configuration.

Data flow: GET /metrics -> ServerMetrics.render -> RouterGauges.update(snapshot, waiting).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Gauge

from gearshift.scheduler.block_hashes import BLOCK_TOKENS


class RouterGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.waiting = Gauge("vllm:num_requests_waiting",
                             "Requests waiting to be admitted (router protocol name)", registry=r)
        self.running = Gauge("vllm:num_requests_running",
                             "Requests running (router protocol name)", registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc",
                              "KV cache usage, 0..1 (router protocol name)", registry=r)
        self.gpu_kv_usage = Gauge("vllm:gpu_cache_usage_perc",
                                  "KV cache usage, 0..1 (older router protocol name)", registry=r)
        self.cache_info = Gauge("vllm:cache_config_info", "KV cache layout for prefix scorers",
                                ["block_size", "num_gpu_blocks"], registry=r)
        self.lora_info = Gauge("vllm:lora_requests_info", "LoRA adapters (none are served)",
                               ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
                               registry=r)
        self._blocks: str | None = None

    def update(self, snapshot, num_waiting: int) -> None:
        mem = snapshot.memory
        total = mem.get("kv_slots_total", 0)
        held = total - mem.get("kv_slots_free", 0) - mem.get("kv_slots_cached", 0)
        usage = held / total if total else 0.0
        self.waiting.set(num_waiting)
        self.running.set(snapshot.num_running)
        self.kv_usage.set(usage)
        self.gpu_kv_usage.set(usage)
        blocks = str(total // BLOCK_TOKENS)
        if blocks != self._blocks:  # one series: the current layout
            self.cache_info.clear()
            self._blocks = blocks
        self.cache_info.labels(block_size=str(BLOCK_TOKENS), num_gpu_blocks=blocks).set(1)
        self.lora_info.labels(max_lora="0", running_lora_adapters="",
                              waiting_lora_adapters="").set(time.time())
