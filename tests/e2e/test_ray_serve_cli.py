"""`gearshift serve --data-parallel-size 2` on a CPU (a local Ray instance, the default
model): the OpenAI endpoints answer with one engine's greedy text, /metrics shows a series
per replica and the router-protocol gauges, and bad replica flags fail before Ray starts.

Data flow (tests only): subprocess `python -m gearshift.cli serve -dp 2` -> openai client /
httpx; the same prompt -> LLM.generate (one engine) for the text to compare with.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest
from served_process import ROOT, serve_process

pytest.importorskip("ray", reason="Ray is not installed (pip install 'gearshift[ray]')")

from gearshift import LLM, SamplingParams  # noqa: E402
from gearshift.models.default import default_target_dir  # noqa: E402
from gearshift.server.background import free_port  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_two_replicas_answer_the_openai_api_with_per_replica_metrics():
    prompt = "Once upon a time"
    llm = LLM(None, device="cpu", kv_cache_tokens=2048, max_num_seqs=4)
    want = llm.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0),
                        use_tqdm=False)[0].text
    with serve_process(default_target_dir(), "--data-parallel-size", "2",
                       start_timeout=240) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        got = [client.completions.create(model=model, prompt=prompt, max_tokens=10,
                                         temperature=0).choices[0].text for _ in range(2)]
        chat = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=5)
        metrics = httpx.get(base + "/metrics").text
    assert got == [want, want]
    assert chat.choices[0].message.content
    for replica in ("0", "1"):
        assert f'gearshift_replica_up{{replica="{replica}"}} 1.0' in metrics
        assert f'gearshift_replica_kv_slots_total{{replica="{replica}"}} 2048.0' in metrics
    assert "vllm:num_requests_waiting 0.0" in metrics
    assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="256"} 1.0' in metrics


@pytest.mark.parametrize("flags,message", [
    (["--data-parallel-size", "0"], "--data-parallel-size must be >= 1"),
    (["--data-parallel-size", "2", "--kv-events", "5557"], "expected tcp://HOST:PORT"),
])
def test_bad_replica_flags_fail_with_a_message(flags, message):
    res = subprocess.run([sys.executable, "-m", "gearshift.cli", "serve", "--device", "cpu",
                          "--port", str(free_port()), *flags], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr[-2000:]
