"""`gearshift serve --tensor-parallel-size 2` on a CPU: the OpenAI endpoints answer with the
same greedy text as a one-process engine (completions, chat, a stream), the metrics report
the TP size; then one rank is killed while the server idles: /health stops answering 200
and the server exits non-zero within seconds, naming the rank.

Data flow (tests only): subprocess `python -m gearshift.cli serve -tp 2` (rank 0; rank 1 its
worker process) -> openai client -> texts compared with LLM.generate at TP=1.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest
from conftest import CPU_ENGINE_DEFAULTS
from served_process import serve_process

from gearshift import LLM, SamplingParams

PROMPTS = ["Once upon a time", "The quick brown fox", "hello world"]


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    with serve_process(tiny_llama_dir, "-tp", "2", "--served-model-name", "tiny") as served:
        yield served


def test_greedy_text_equals_one_process(served, tiny_llama_dir):
    base, _ = served
    llm = LLM(str(tiny_llama_dir), **CPU_ENGINE_DEFAULTS)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    want = [o.text for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    got = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == want
    stream = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12,
                                       temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == want[0]
    metrics = httpx.get(base + "/metrics").text
    assert "gearshift_tensor_parallel_size 2.0" in metrics


def test_a_killed_rank_stops_the_server(served):
    base, proc = served
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1  # rank 1
    os.kill(int(children[0]), signal.SIGKILL)
    t0 = time.monotonic()
    code = proc.wait(timeout=15)
    assert time.monotonic() - t0 < 10
    assert code == 1
    err = proc.stderr.read()
    assert "rank 1 was killed by signal 9" in err, err[-3000:]
