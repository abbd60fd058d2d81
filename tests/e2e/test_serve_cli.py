"""`gearshift serve MODEL` end to end on a tiny checkpoint: the positional model, the served
name, an inline chat template and the start-up summary at the default log level; then the
official client's models.retrieve, a chat request and /tokenize agreeing on its prompt.

Data flow (tests only): subprocess `python -m gearshift.cli serve ...` -> uvicorn on a free
loopback port -> openai client / httpx -> the served answers.
"""

from __future__ import annotations

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
