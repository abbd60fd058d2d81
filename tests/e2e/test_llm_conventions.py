"""The offline API's conventions on a tiny real checkpoint: LLM.chat through the chat
template (one conversation or several; a clear error without a template or tokenizer),
the tokenizer / chat-template / served-name options, max_model_len past the model's
positions only when allowed, the start-up summary at INFO and generate's progress bar.

Data flow (tests only): LLM(tiny checkpoint, options) -> chat / generate -> outputs compared
with generate over the template's token ids; stderr read through capsys.
"""

from __future__ import annotations

import logging

import pytest
import torch

from gearshift import SamplingParams
from gearshift.config import ConfigError
from gearshift.tokenizer import ChatTemplateError

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
CONVERSATION = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def _template_ids(llm, messages, template=None) -> list[int]:
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template,
                                             add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def test_chat_equals_generate_over_the_template(make_llm, tiny_llama_dir):
    llm = make_llm(tiny_llama_dir)
    [one] = llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    [ref] = llm.generate([_template_ids(llm, CONVERSATION)], GREEDY, use_tqdm=False)
    assert one.token_ids == ref.token_ids and one.text == ref.text
    other = [{"role": "user", "content": [{"type": "text", "text": "once upon"}]}]
    outs = llm.chat([CONVERSATION, other], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == [
        ref.token_ids,
        llm.generate([_template_ids(llm, [{"role": "user", "content": "once upon"}])], GREEDY,
                     use_tqdm=False)[0].token_ids]
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    [custom] = llm.chat(CONVERSATION, GREEDY, use_tqdm=False, chat_template=template)
    [ref] = llm.generate([_template_ids(llm, CONVERSATION, template)], GREEDY, use_tqdm=False)
    assert custom.token_ids == ref.token_ids


def test_chat_without_a_template_or_tokenizer(make_llm, tiny_llama_dir, tiny_no_tokenizer_dir):
    llm = make_llm(tiny_llama_dir)
    llm.tokenizer.chat_template = None
    with pytest.raises(ChatTemplateError, match="no chat template"):
        llm.chat(CONVERSATION, GREEDY, use_tqdm=False)
    with pytest.raises(ChatTemplateError, match="no tokenizer"):
        make_llm(tiny_no_tokenizer_dir).chat(CONVERSATION, GREEDY, use_tqdm=False)


def test_tokenizer_template_and_name_options(make_llm, tiny_llama_dir, tiny_no_tokenizer_dir,
                                             tmp_path):
    llm = make_llm(tiny_no_tokenizer_dir, tokenizer=str(tiny_llama_dir),
                   served_model_name="org/tiny")
    assert llm.engine.model_name == "org/tiny"
    assert llm.generate("hello", GREEDY, use_tqdm=False)[0].token_ids  # text prompts work
    path = tmp_path / "template.jinja"
    path.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    for value in (str(path), path.read_text()):
        llm = make_llm(tiny_llama_dir, chat_template=value)
        assert llm.tokenizer.chat_template == path.read_text()
    path.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="chat template: line 1"):
        make_llm(tiny_llama_dir, chat_template=str(path))
    with pytest.raises(ConfigError, match="tokenizer"):
        make_llm(tiny_llama_dir, tokenizer=str(tmp_path))


def test_max_model_len_past_the_model_needs_allowing(make_llm, tiny_llama_dir):
    with pytest.raises(ConfigError, match="max_position_embeddings 512"):
        make_llm(tiny_llama_dir, max_model_len=1024)
    llm = make_llm(tiny_llama_dir, max_model_len=1024, allow_long_max_model_len=True)
    assert llm.engine.max_model_len == 1024
    assert llm.generate([[5] * 600], GREEDY, use_tqdm=False)[0].token_ids


def test_start_up_summary_and_generate_bar(make_llm, tiny_llama_dir, capsys):
    logging.getLogger("gearshift").setLevel(logging.INFO)  # the default outside tests
    llm = make_llm(tiny_llama_dir, cpu_threads=1)
    err = capsys.readouterr().err
    assert "[gearshift.runner] loaded the weights (0.00 GiB) in" in err, err
    assert torch.get_num_threads() == 1
    llm.generate(["a", "b"], GREEDY)
    assert "Processed prompts" in capsys.readouterr().err
    llm.generate(["a"], GREEDY, use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err
