"""GET /metrics after some traffic: request counts by status, latency histograms, token
counters, queue and KV gauges, and the engine's own counters (nested ones flattened).

Data flow (tests only): httpx -> live server (fake engine) -> /metrics text -> parsed samples.
"""

from __future__ import annotations

import httpx
from fake_engine import fake_server


def _samples(base_url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_after_traffic():
    with fake_server(step_delay=0.001, kv_slots=5000, tokens_per_step=2) as srv:
        with httpx.Client(base_url=srv.base_url, timeout=10) as c:
            for max_tokens in (4, 6, 8):
                r = c.post("/v1/completions", json={"prompt": "ab", "max_tokens": max_tokens})
                assert r.status_code == 200
            c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 0})
            with c.stream("POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                    "stream": True}) as r:
                assert r.status_code == 200 and r.read()
        srv.wait_idle()
        m = _samples(srv.base_url)
    assert m['gearshift_requests_total{endpoint="/v1/completions",status="200"}'] == 3
    assert m['gearshift_requests_total{endpoint="/v1/completions",status="400"}'] == 1
    assert m['gearshift_requests_total{endpoint="/v1/chat/completions",status="200"}'] == 1
    assert m['gearshift_request_finish_total{reason="length"}'] == 4
    assert m["gearshift_generation_tokens_total"] == 4 + 6 + 8 + 5
    assert m["gearshift_prompt_tokens_total"] > 3 * 3
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "time_per_output_token_seconds"):
        assert m[f"gearshift_{hist}_count"] == 4, hist
        assert m[f"gearshift_{hist}_sum"] > 0
    assert m["gearshift_kv_slots_total"] == 5000 and m["gearshift_kv_slots_free"] == 5000
    assert m["gearshift_num_requests_running"] == 0 and m["gearshift_num_requests_waiting"] == 0
    assert m['gearshift_engine_stat{name="tokens_generated"}'] == 23
    assert m['gearshift_engine_stat{name="steps_by_k.1"}'] == m['gearshift_engine_stat{name="steps"}']
    # request-steps by the K each request was given
    assert m['gearshift_spec_request_steps{k="1"}'] == m['gearshift_engine_stat{name="steps"}']


def test_speculation_counters_by_proposer():
    """A hybrid engine's spec_stats()["proposers"]: one series per proposer."""
    from gearshift.frontend.engine_loop import EngineSnapshot
    from gearshift.server.metrics import ServerMetrics

    spec = {"steps_by_k": {0: 3, 16: 2}, "proposers": {
        "eagle3": {"drafts": 5, "proposed": 20, "accepted": 11},
        "suffix": {"drafts": 2, "proposed": 30, "accepted": 27, "from_request": 2,
                   "calibration": [0.5] * 10}}}
    text = ServerMetrics().render(EngineSnapshot(stats={"spec": spec}), 0).decode()
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            m[name] = float(value)
    assert m['gearshift_spec_proposer_tokens{kind="accepted",proposer="suffix"}'] == 27
    assert m['gearshift_spec_proposer_tokens{kind="proposed",proposer="eagle3"}'] == 20
    assert m['gearshift_spec_proposer_drafts{proposer="suffix"}'] == 2
