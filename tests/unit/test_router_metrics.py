"""/metrics carries the gauges outside routers read under their default names (the
inference extension's endpoint picker, llm-d, Dynamo): waiting and running requests, KV
usage as a fraction held by running requests, the block layout and the LoRA info series."""

from __future__ import annotations

from prometheus_client import generate_latest

from gearshift.frontend.async_engine import EngineSnapshot
from gearshift.server.metrics import ServerMetrics


def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_router_protocol_names_follow_the_snapshot():
    metrics = ServerMetrics()
    snap = EngineSnapshot(num_running=3, num_waiting=2, memory={
        "kv_slots_total": 1600, "kv_slots_free": 1000, "kv_slots_cached": 200})
    m = _samples(metrics.render(snap, num_waiting=5).decode())
    assert m["vllm:num_requests_waiting"] == 5  # with the adds not yet taken by the engine
    assert m["vllm:num_requests_running"] == 3
    assert m["vllm:kv_cache_usage_perc"] == 0.25  # (1600 - 1000 - 200) / 1600
    assert m["vllm:gpu_cache_usage_perc"] == 0.25
    assert m['vllm:cache_config_info{block_size="16",num_gpu_blocks="100"}'] == 1
    lora = 'vllm:lora_requests_info{max_lora="0",running_lora_adapters="",waiting_lora_adapters=""}'
    assert m[lora] > 1e9  # the scrape's time stamp


def test_one_cache_info_series_after_the_cache_changes():
    metrics = ServerMetrics()
    metrics.render(EngineSnapshot(memory={"kv_slots_total": 160}), 0)
    metrics.render(EngineSnapshot(memory={"kv_slots_total": 320}), 0)
    text = generate_latest(metrics.registry).decode()
    assert text.count("vllm:cache_config_info{") == 1 and 'num_gpu_blocks="20"' in text
