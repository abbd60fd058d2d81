"""A short soak against a fake-engine server: random parameters, disconnects and bad bodies;
no 5xx, no live request left, KV slots all free, still healthy.

Data flow (tests only): gearshift.bench.soak.soak -> httpx -> uvicorn -> FakeEngine.
"""

from __future__ import annotations

import asyncio

import pytest
from fake_engine import fake_server

from gearshift.bench.soak import soak


def test_short_soak_passes():
    with fake_server(step_delay=0.001, max_num_seqs=16, max_model_len=1024) as srv:
        result = asyncio.run(soak(srv.base_url, num_requests=300, concurrency=16,
                                  time_limit=60, seed=1, disconnect_prob=0.2, bad_prob=0.1,
                                  progress=False))
        srv.wait_idle()
    assert result["passed"], result
    assert result["requests"] == 300
    outcomes = result["outcomes"]
    assert outcomes.get("200", 0) > 150
    assert outcomes.get("disconnect", 0) > 10 and outcomes.get("400", 0) > 5


def test_soak_refuses_non_loopback():
    with pytest.raises(ValueError, match="loopback"):
        asyncio.run(soak("http://10.0.0.1:8000", num_requests=1, concurrency=1, time_limit=1))


def test_soak_is_a_bench_command():
    from gearshift.bench import soak as soak_module
    from gearshift.cli import build_parser

    args = build_parser().parse_args(["bench", "soak", "--num-requests", "5", "--time-limit", "30"])
    assert args.func is soak_module.run and args.num_requests == 5 and args.device == "cpu"
    with pytest.raises(SystemExit, match="time-limit must be > 0"):  # before any engine is built
        soak_module.run(build_parser().parse_args(["bench", "soak", "--time-limit", "0"]))


def _engine_flags(parser) -> set[str]:
    group = next(g for g in parser._action_groups if g.title == "engine")
    return {o for a in group._group_actions for o in a.option_strings}


def test_soak_takes_every_engine_flag_of_serve():
    """The engine flags are one set (gearshift/engine_args.py): the soak's server is built
    from the same ones as `serve`'s, with the soak's own defaults (CPU, a small cache)."""
    from gearshift.cli import _every_subparser, build_parser
    from gearshift.engine_args import engine_kwargs

    parsers = {p.prog.split(" ", 1)[1]: p for p in _every_subparser(build_parser())}
    serve = _engine_flags(parsers["serve"])
    assert "--max-model-len" in serve and "--no-enable-prefix-caching" in serve
    for name in ("bench soak", "bench offline", "bench sweep", "generate"):
        assert _engine_flags(parsers[name]) == serve, name
    args = build_parser().parse_args(["bench", "soak", "--max-model-len", "512", "--seed", "3",
                                      "--no-enable-prefix-caching", "--attention-backend", "torch"])
    kw = engine_kwargs(args)
    assert (kw["max_model_len"], kw["seed"], kw["enable_prefix_caching"]) == (512, 3, False)
    assert (kw["device"], kw["max_num_seqs"], kw["kv_cache_tokens"]) == ("cpu", 32, 16384)
    assert kw["attention_backend"] == "torch" and args.seed == 3


def test_short_hostile_soak_passes():
    """Hostile bodies and greedy checks in the load, a small idle-connection flood and huge
    prompts beside a stream first: no 5xx, greedy texts equal their solo runs, /health fast."""
    with fake_server(step_delay=0.001, max_num_seqs=16, max_model_len=1024,
                     max_body_bytes=8 << 20) as srv:
        result = asyncio.run(soak(srv.base_url, num_requests=200, concurrency=8, time_limit=60,
                                  seed=2, bad_prob=0.2, progress=False, hostile=True,
                                  flood_connections=300, stall_prompts=2))
        srv.wait_idle()
    assert result["passed"], result
    outcomes = result["outcomes"]
    assert outcomes.get("hostile-400", 0) > 5 and outcomes.get("greedy-equal", 0) > 5
    assert "greedy-mismatch" not in outcomes
    assert result["flood"]["opened"] == 300 and result["flood"]["health_ok"]
    assert result["stall"]["statuses"] == [400, 400]  # past the fake model's context
    assert len(result["rss_mb"]) >= 2
