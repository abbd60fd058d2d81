"""An evaluation harness through the server scores as the model does in `transformers`, on
the embedded default model: lm-evaluation-harness's `local-completions` requests (token ids
with BOS, echo, logprobs=1, max_tokens=1; the sum of token_logprobs[ctxlen:-1]) give each
choice's log-likelihood within 1e-3 of the HF model's and the same answers, by hand always
and through lm_eval itself when it is installed (`pip install 'lm_eval[api,hf]'`, not part
of the test extra: see docs/server.md, "Evaluation harnesses"). Also on the real model:
echo + logprobs offsets slice the text, and every top_logprobs entry holds its token.

Data flow (tests only): openai client / lm_eval -> uvicorn -> app -> AsyncEngine -> Engine
(default model, CPU, float32); the same ids -> transformers LlamaForCausalLM -> log_softmax.
"""

from __future__ import annotations

import importlib.util
import json

import openai
import pytest
import torch

from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import build_engine_config
from gearshift.models.default import default_target_dir
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

TARGET = default_target_dir()
TOLERANCE = 1e-3  # nats, per choice
# (context, the right continuation); each item's wrong choices are the next items' answers
SNIPPETS = [
    ("import os\n\ndef main():\n    path = os.path.", "join(root, name)"),
    ("for i in range(", "len(items)):\n"),
    ("class Parser(", "object):\n"),
    ("if __name__ == ", "'__main__':\n"),
    ("    def __init__(self, ", "name):\n"),
    ("import sys\n\nsys.", "exit(1)\n"),
    ("try:\n    value = int(text)\nexcept ", "ValueError:\n"),
    ("    return ", "None\n"),
    ("        raise ", "TypeError('expected a string')\n"),
    ("from collections import ", "defaultdict\n"),
]
ITEMS = [{"context": ctx, "choices": [ans] + [SNIPPETS[(i + k) % len(SNIPPETS)][1] for k in (1, 2, 3)],
          "label": 0} for i, (ctx, ans) in enumerate(SNIPPETS)]


@pytest.fixture(scope="module")
def server():
    config = build_engine_config(str(TARGET), device="cpu", dtype="float32",
                                 attention_backend="torch", kv_cache_tokens=4096, max_num_seqs=8)
    engine = AsyncEngine(Engine(config))
    with BackgroundServer(build_app(engine)) as srv:
        yield srv, engine.model_name


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0].base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TARGET))


@pytest.fixture(scope="module")
def hf_model():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()


def _pair(tokenizer, context: str, continuation: str) -> tuple[list[int], int]:
    """lm-eval's encoding of a (context, continuation) request with add_bos_token=True: the
    context's ids (BOS first), then the whole text's ids after as many; -> (ids, ctxlen)."""
    ctx = tokenizer(context).input_ids
    whole = tokenizer(context + continuation).input_ids
    return ctx + whole[len(ctx):], len(ctx)


def _hf_loglikelihood(model, ids: list[int], ctxlen: int) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()  # [len(ids), vocab]
    logp = torch.log_softmax(logits, dim=-1)
    return sum(logp[t - 1, ids[t]].item() for t in range(ctxlen, len(ids)))


def test_lm_eval_requests_score_as_the_hf_model(server, client, tokenizer, hf_model):
    """The request lm-eval's local-completions sends for a log-likelihood, parsed as it
    parses it: each choice within 1e-3 nats of transformers, the same answer per item."""
    pairs = [_pair(tokenizer, it["context"], c) for it in ITEMS for c in it["choices"]]
    out = client.completions.create(model=server[1], prompt=[ids for ids, _ in pairs],
                                    temperature=0, max_tokens=1, logprobs=1, seed=1234, echo=True)
    choices = sorted(out.choices, key=lambda c: c.index)
    assert len(choices) == len(pairs)
    ours = []
    for choice, (ids, ctxlen) in zip(choices, pairs, strict=True):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None
        ours.append(sum(lp.token_logprobs[ctxlen:-1]))
        for tok, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
            assert top[tok] == value  # the token is there, whatever its rank
    theirs = [_hf_loglikelihood(hf_model, ids, ctxlen) for ids, ctxlen in pairs]
    assert max(abs(a - b) for a, b in zip(ours, theirs)) < TOLERANCE
    n = len(ITEMS[0]["choices"])

    def answers(scores):
        return [max(range(n), key=lambda k: scores[i * n + k]) for i in range(len(ITEMS))]

    assert answers(ours) == answers(theirs)


def test_text_prompt_that_starts_with_bos_gets_one(server, client, tokenizer):
    """A text prompt already starting with the BOS token's text (lm-eval's text requests
    with add_bos_token) is not given a second; add_special_tokens: false (vLLM's field)
    adds none."""
    plain = len(tokenizer("def f():").input_ids)  # BOS + the text
    for prompt, special, count in (("def f():", True, plain),
                                   (tokenizer.bos_token + "def f():", True, plain),
                                   ("def f():", False, plain - 1)):
        out = client.completions.create(model=server[1], prompt=prompt, max_tokens=1,
                                        extra_body={"add_special_tokens": special})
        assert out.usage.prompt_tokens == count, (prompt, special)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_offsets_and_top_logprobs_on_the_model(server, client, tokenizer, stream):
    prompt = "def greet(name):\n    return 'h\u00e9llo ' + name\n"
    resp = client.completions.create(model=server[1], prompt=prompt, max_tokens=24,
                                     temperature=0, echo=True, logprobs=2, stream=stream,
                                     extra_body={"ignore_eos": True})
    chunks = list(resp) if stream else [resp]
    text = "".join(ch.text for c in chunks for ch in c.choices)
    rows = [row for c in chunks for ch in c.choices if ch.logprobs is not None
            for row in zip(ch.logprobs.tokens, ch.logprobs.token_logprobs,
                           ch.logprobs.top_logprobs, ch.logprobs.text_offset, strict=True)]
    n_prompt = len(tokenizer(prompt).input_ids)
    assert text.startswith(prompt) and len(rows) == n_prompt + 24
    offsets = [r[3] for r in rows]
    assert offsets[:2] == [0, 0] and offsets == sorted(offsets)  # BOS: not in the text
    pieces = [text[a:b] for a, b in zip(offsets, offsets[1:] + [len(text)])]
    assert "".join(pieces) == text
    for i, ((tok, value, top, _), piece) in enumerate(zip(rows, pieces)):
        if i == 0:
            assert top is None and value is None and piece == ""
            continue
        assert top[tok] == value and len(top) <= 3  # the token + the 2 likeliest
        if "\ufffd" not in top:  # (pieces of characters share that key)
            assert len(top) >= 2
        if tok in tokenizer.all_special_tokens:  # generated special tokens are not in the text
            assert piece == ""
        elif "\ufffd" not in tok:
            assert piece == tok


# ---------------------------------------------------------------- through lm_eval itself


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


NEEDS = _missing("lm_eval", "accelerate", "tenacity")


@pytest.mark.skipif(bool(NEEDS), reason=f"needs {', '.join(NEEDS)}: pip install 'lm_eval[api,hf]' "
                    "(not in the test extra: it brings pandas, pyarrow, datasets, scikit-learn)")
def test_lm_eval_through_the_server_agrees_with_its_hf_backend(server, tmp_path, monkeypatch):
    """The documented settings (docs/server.md): local-completions with the model's
    tokenizer and add_bos_token=True scores every choice of a tiny local task within 1e-3
    of lm_eval's hf backend, and gets the same accuracy."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(it) + "\n" for it in ITEMS))
    (tmp_path / "task.yaml").write_text(
        "task: gearshift_code_choice\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'items.jsonl'}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        'target_delimiter: ""\nmetric_list:\n  - metric: acc\n'
        "    aggregation: mean\n    higher_is_better: true\n")
    tasks = TaskManager(include_path=str(tmp_path))

    def evaluate(model: str, model_args: str) -> dict:
        out = lm_eval.simple_evaluate(model=model, model_args=model_args,
                                      tasks=["gearshift_code_choice"], task_manager=tasks,
                                      log_samples=True, batch_size=4)
        return out["results"]["gearshift_code_choice"]["acc,none"], {
            s["doc_id"]: [r[0][0] for r in s["resps"]]
            for s in out["samples"]["gearshift_code_choice"]}

    srv, name = server
    hf_acc, hf = evaluate("hf", f"pretrained={TARGET},dtype=float32,device=cpu")
    api_acc, api = evaluate("local-completions",
                            f"model={name},base_url={srv.base_url}/v1/completions,"
                            f"tokenizer={TARGET},add_bos_token=True,num_concurrent=1,max_retries=1")
    assert sorted(hf) == sorted(api) == list(range(len(ITEMS)))
    worst = max(abs(a - b) for d in hf for a, b in zip(hf[d], api[d], strict=True))
    assert worst < TOLERANCE and api_acc == hf_acc
