"""`gearshift serve MODEL` end to end on a tiny checkpoint: the positional model, the served
name, an inline chat template and the start-up summary at the default log level; then the
official client's models.retrieve, a chat request and /tokenize agreeing on its prompt; the
engine in a process of its own (or, told so, on a thread), gone when the server stops.

Data flow (tests only): subprocess `python -m gearshift.cli serve ...` -> uvicorn on a free
loopback port -> openai client / httpx -> the served answers.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
from served_process import serve_process

TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    with serve_process(tiny_llama_dir, "--served-model-name", "org/tiny", "--chat-template",
                       TEMPLATE, "--cpu-threads", "1") as served:
        yield served


def test_served_name_template_and_tokenize(served):
    base, _ = served
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    assert client.models.retrieve("org/tiny").id == "org/tiny"
    assert [m.id for m in client.models.list().data] == ["org/tiny"]
    messages = [{"role": "user", "content": "hello there"}]
    out = client.chat.completions.create(model="org/tiny", messages=messages, max_tokens=4,
                                         temperature=0)
    tokens = httpx.post(base + "/tokenize", json={"messages": messages}).json()
    assert tokens["count"] == out.usage.prompt_tokens
    text = httpx.post(base + "/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "user: hello there\nassistant:"


def test_start_up_summary_at_the_default_level(served):
    _, proc = served
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "[gearshift.runner] loaded the weights" in err, err[-3000:]
    assert "serving 'org/tiny'" in err


def _engine_children(pid: int) -> list[int]:
    """The spawned engine processes among `pid`'s children (not multiprocessing's tracker)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


@pytest.mark.parametrize("flags, engines", [((), 1), (("--no-engine-process",), 0)])
def test_the_engine_steps_in_a_process_of_its_own_unless_told(tiny_llama_dir, flags, engines):
    with serve_process(tiny_llama_dir, "--cpu-threads", "1", *flags) as (base, proc):
        kids = _engine_children(proc.pid)
        assert len(kids) == engines
        r = httpx.post(base + "/v1/completions", json={"prompt": "hello", "max_tokens": 4,
                                                     "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        proc.terminate()
        proc.wait(timeout=30)
    for kid in kids:  # stopped with the server, not left behind
        deadline = time.monotonic() + 10
        while Path(f"/proc/{kid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{kid}").exists()
