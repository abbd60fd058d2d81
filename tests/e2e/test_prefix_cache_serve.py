"""The prefix cache through the server: `bench serve --workload shared-prefix | multi-turn`
against a live server on a tiny checkpoint reports what the cache served (usage's
prompt_tokens_details.cached_tokens), and /metrics counts the same.

Data flow (tests only): bench serve -> uvicorn -> app -> AsyncEngine -> Engine (tiny Llama).
"""

from __future__ import annotations

import argparse
import json

import httpx
import pytest

from gearshift.bench.serve import add_serve_bench_args, run_serve_bench
from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import build_engine_config
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

OPTIONS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=16,
               kv_cache_tokens=8192, max_num_batched_tokens=512)


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_bench_args(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("workload", ["shared-prefix", "multi-turn"])
def test_bench_serve_workloads_hit_the_prefix_cache(tiny_llama_dir, tmp_path, workload):
    engine = Engine(build_engine_config(str(tiny_llama_dir), **OPTIONS))
    out = tmp_path / "b.json"
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        args = _args("--base-url", srv.base_url, "--workload", workload, "--num-prompts", "6",
                     "--turns", "3", "--shared-prefix-len", "60", "--input-len", "8",
                     "--output-len", "6", "--concurrency", "3", "--dataset", "random-words",
                     "--output-json", str(out))
        assert run_serve_bench(args) == 0
        metrics = httpx.get(srv.base_url + "/metrics").text
        mem = engine.memory_stats()
    result = json.loads(out.read_text())
    turns = 3 if workload == "multi-turn" else 1
    assert result["completed"] == 6 * turns and result["failed"] == 0
    assert result["prefix_cache_hit_rate"] > 0.4 and result["cached_prompt_tokens"] > 0
    assert "gearshift_prefix_cache_hits_tokens_total" in metrics
    assert mem["kv_slots_free"] + mem["kv_slots_cached"] == mem["kv_slots_total"]
