"""`bench serve` against a live fake-engine server: every request completes, token counts and
latency percentiles are consistent, and the JSON is written.

Data flow (tests only): run_serve_bench -> httpx streaming -> uvicorn -> FakeEngine.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import pytest
from fake_engine import fake_server

from gearshift.bench.serve import add_serve_bench_args, run_serve_bench
from gearshift.bench.workloads import conversations


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_serve_bench_args(p)
    return p.parse_args(list(argv))


def test_bench_serve_end_to_end(tmp_path):
    out = tmp_path / "bench.json"
    t0 = time.time()
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
    start, end = result["window"]  # the timed requests' span, for a server's step trace
    assert t0 < start < end < time.time()
    assert end - start == pytest.approx(result["duration_s"], abs=1e-3)


def test_bench_serve_reports_failures(tmp_path):
    with fake_server(api_key="k") as srv:
        args = _args("--base-url", srv.base_url, "--api-key", "wrong", "--model", "fake-model",
                     "--num-prompts", "3", "--warmup", "0", "--output-json",
                     str(tmp_path / "b.json"))
        assert run_serve_bench(args) == 1
    result = json.loads((tmp_path / "b.json").read_text())
    assert result["failed"] == 3 and "HTTP 401" in result["errors"][0]


def test_bad_arguments_and_prompts(tmp_path):
    with pytest.raises(ValueError, match="concurrency"):
        run_serve_bench(_args("--concurrency", "0"))
    with pytest.raises(ValueError, match="--dataset"):
        run_serve_bench(_args("--dataset", "imagenet"))
    with pytest.raises(ValueError, match="no such file"):
        run_serve_bench(_args("--dataset", f"jsonl:{tmp_path / 'missing.jsonl'}"))
    ids = conversations(_args("--num-prompts", "3", "--input-len", "7", "--warmup", "0"))
    assert [len(c.first()) for c in ids] == [7, 7, 7]
    words = conversations(_args("--dataset", "random-words", "--num-prompts", "2", "--warmup", "0"))
    assert all(isinstance(c.first(), str) for c in words)
    corpus = conversations(_args("--dataset", "corpus", "--num-prompts", "2", "--input-len", "50"))
    assert all(isinstance(c.first(), str) and len(c.first()) == 200 for c in corpus)


def test_corpus_prompts_are_distinct_while_the_corpus_lasts():
    """As the closed loop's: a repeated prompt would be a prefix-cache hit, a prefill the
    server skips and the loop pays. Past the corpus's windows they come round again."""
    from gearshift.bench.workloads import _corpus_windows

    windows = _corpus_windows(128, random.Random(0))  # as --seed 0 shuffles them
    n = len(windows)
    args = _args("--dataset", "corpus", "--num-prompts", str(n + 5), "--warmup", "0",
                 "--input-len", "128", "--seed", "0")
    prompts = [c.first() for c in conversations(args)]
    assert prompts == [windows[i % n] for i in range(n + 5)]
    assert len(set(prompts[:n])) == len(set(windows)) > 100


def test_jsonl_datasets_in_both_shapes(tmp_path):
    """vLLM's custom-dataset shape ({"prompt": ...} per line) and OpenAI chat messages, both
    served (the chat ones through /v1/chat/completions)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "hello there"}\n\n'
                    '{"messages": [{"role": "user", "content": "hi"}]}\n'
                    '{"prompt": [11, 12, 13]}\n')
    convos = conversations(_args("--dataset", f"jsonl:{data}", "--num-prompts", "5"))
    assert [c.chat for c in convos] == [False, True, False, False, True, False]
    out = tmp_path / "b.json"
    with fake_server(step_delay=0.001) as srv:
        args = _args("--base-url", srv.base_url, "--dataset", f"jsonl:{data}", "--num-prompts",
                     "6", "--output-len", "4", "--output-json", str(out))
        assert run_serve_bench(args) == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 6 and result["output_tokens"] == 24
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match="prompt"):
        conversations(_args("--dataset", f"jsonl:{bad}"))


def test_rate_sweep_writes_each_rate_with_and_without_speculation(tmp_path):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    with fake_server(step_delay=0.001) as srv:
        args = _args("--base-url", srv.base_url, "--num-prompts", "6", "--output-len", "4",
                     "--concurrency", "4", "--sweep-rates", "50,inf", "--compare-speculative",
                     "--output-json", str(out), "--output-png", str(png))
        assert run_serve_bench(args) == 0
        resets = srv.engine.prefix_cache_resets
        speculative = [p.speculative for p in srv.engine.params_seen.values()]
    sweep = json.loads(out.read_text())
    assert sweep["rates"] == [50.0, float("inf")]
    assert [len(v) for v in sweep["runs"].values()] == [2, 2]
    assert sweep["runs"]["plain"][0]["config"]["no_speculative"] is True
    assert png.stat().st_size > 1000
    assert resets == 6  # every run sends the same prompts: none finds the last one's cached
    # an untimed burst of --concurrency prompts in each mode, then the modes take turns at
    # going first
    assert [r["completed"] for r in sweep["warmup"].values()] == [4, 4]
    assert sweep["order"] == [["speculative", "plain"], ["plain", "speculative"]]
    # (speculative, requests) in the order sent: the bursts, then 6 + 1 warm-up request a
    # run, where rate inf's plain run follows rate 50's
    assert _runs_of(speculative) == [(True, 4), (False, 4), (True, 7), (False, 14), (True, 7)]


def test_rate_sweep_runs_each_rate_for_its_seconds(tmp_path):
    """--sweep-seconds: a run at rate r sends max(--num-prompts, r x seconds) prompts (all at
    once: --num-prompts), so a fast rate's p99 is not its slowest of a few requests."""
    out = tmp_path / "s.json"
    with fake_server(step_delay=0.001) as srv:
        args = _args("--base-url", srv.base_url, "--num-prompts", "6", "--output-len", "3",
                     "--concurrency", "4", "--sweep-rates", "20,100,inf", "--sweep-seconds",
                     "0.2", "--no-sweep-warmup", "--warmup", "0", "--output-json", str(out),
                     "--output-png", str(tmp_path / "s.png"))
        assert run_serve_bench(args) == 0
    runs = json.loads(out.read_text())["runs"]["default"]
    assert [r["completed"] for r in runs] == [6, 20, 6]
    assert [r["config"]["num_prompts"] for r in runs] == [6, 20, 6]
    with pytest.raises(ValueError, match="--sweep-seconds"):
        run_serve_bench(_args("--sweep-seconds", "5"))  # no --sweep-rates
    with pytest.raises(ValueError, match="--sweep-seconds"):
        run_serve_bench(_args("--sweep-rates", "2", "--sweep-seconds", "-1"))


def test_a_cut_rate_sweep_keeps_the_rates_it_finished(tmp_path, monkeypatch):
    """The JSON is written after every rate: a sweep stopped by its time limit (SIGTERM in
    benchmarks/h200_serve.sh) keeps the rates it measured."""
    from gearshift.bench import serve_sweep

    def fake_run(args, label, rate, reset, warmup=None, prompts=None):
        if rate > 10:
            raise KeyboardInterrupt  # the time limit, mid-sweep
        return {"output_tok_per_s": 1.0, "ttft_ms": {"p50": 1.0}, "tpot_ms": {"p50": 1.0},
                "failed": 0, "config": {"num_prompts": prompts}}

    monkeypatch.setattr(serve_sweep, "_run", fake_run)
    out = tmp_path / "s.json"
    args = _args("--sweep-rates", "2,4,32", "--compare-speculative", "--no-sweep-warmup",
                 "--output-json", str(out))
    with pytest.raises(KeyboardInterrupt):
        serve_sweep.run_rate_sweep(args)
    kept = json.loads(out.read_text())
    assert kept["rates"] == [2.0, 4.0, 32.0]
    assert [len(r) for r in kept["runs"].values()] == [2, 2]


def _runs_of(flags: list) -> list[tuple]:
    """Consecutive equal flags -> (flag, count): the runs a sweep sent, in order."""
    out: list[list] = []
    for f in flags:
        if out and out[-1][0] == f:
            out[-1][1] += 1
        else:
            out.append([f, 1])
    return [tuple(r) for r in out]


def test_rate_sweep_keeps_the_cache_when_told_and_warns_where_it_cannot(tmp_path, capsys):
    from gearshift.bench import serve_sweep

    with fake_server(step_delay=0.001) as srv:
        args = _args("--base-url", srv.base_url, "--num-prompts", "2", "--output-len", "2",
                     "--sweep-rates", "inf", "--compare-speculative", "--no-reset-prefix-cache",
                     "--output-json", str(tmp_path / "a.json"), "--output-png",
                     str(tmp_path / "a.png"))
        assert run_serve_bench(args) == 0
        assert srv.engine.prefix_cache_resets == 0
    with fake_server(step_delay=0.001) as srv:  # a server without the routes
        routes = serve_sweep.RESET_ROUTES
        serve_sweep.RESET_ROUTES = ("/no_such_route",)
        try:
            args.reset_prefix_cache, args.base_url = True, srv.base_url
            assert run_serve_bench(args) == 0
        finally:
            serve_sweep.RESET_ROUTES = routes
    assert "prefix_cache_hit_rate" in capsys.readouterr().out
