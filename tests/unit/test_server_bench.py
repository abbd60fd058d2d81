"""`bench serve` against a live fake-engine server: every request completes, token counts and
latency percentiles are consistent, and the JSON is written.

Data flow (tests only): run_serve_bench -> httpx streaming -> uvicorn -> FakeEngine.
"""

from __future__ import annotations

import argparse
import json

import pytest
from fake_engine import fake_server

from gearshift.bench.serve import add_serve_bench_args, make_prompts, run_serve_bench


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_bench_args(p)
    return p.parse_args(list(argv))


def test_bench_serve_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    with fake_server(step_delay=0.002, api_key="k") as srv:
        args = _args("--base-url", srv.base_url, "--api-key", "k", "--concurrency", "6",
                     "--num-prompts", "20", "--request-rate", "200", "--input-len", "12",
                     "--output-len", "9", "--output-json", str(out))
        assert run_serve_bench(args) == 0
        srv.wait_idle()
    result = json.loads(out.read_text())
    assert result["completed"] == 20 and result["failed"] == 0
    assert result["output_tokens"] == 20 * 9
    assert result["prompt_tokens"] == 20 * 12  # token-id prompts have exact lengths
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        row = result[key]
        assert 0 < row["p50"] <= row["p90"] <= row["p99"]
    assert result["ttft_ms"]["p50"] < result["e2e_ms"]["p50"]
    assert result["output_tok_per_s"] > 0


def test_bench_serve_reports_failures(tmp_path):
    with fake_server(api_key="k") as srv:
        args = _args("--base-url", srv.base_url, "--api-key", "wrong", "--model", "fake-model",
                     "--num-prompts", "3", "--warmup", "0", "--output-json",
                     str(tmp_path / "b.json"))
        assert run_serve_bench(args) == 1
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["failed"] == 3 and "HTTP 401" in result["errors"][0]


def test_bad_arguments_and_prompts():
    with pytest.raises(ValueError, match="concurrency"):
        run_serve_bench(_args("--concurrency", "0"))
    ids = make_prompts(3, 7, "ids", seed=1)
    assert [len(p) for p in ids] == [7, 7, 7] and ids == make_prompts(3, 7, "ids", seed=1)
    assert all(isinstance(p, str) for p in make_prompts(2, 5, "text", seed=0))
