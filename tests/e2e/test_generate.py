"""The offline API end to end: string prompts through the tokenizer, stop conditions
(stop strings, stop token ids, EOS, max_tokens), seeded sampling, per-prompt params, and
model directories without a tokenizer.

Data flow: LLM.generate(prompts, SamplingParams) -> tokenizer -> engine -> detokenizer ->
RequestOutput(token_ids, text, finish_reason).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from checkpoints import EOS_ID, assert_idle_invariant, random_prompts

from gearshift import SamplingParams

TEXT_PROMPTS = ["Hello world", "Once upon a time there was a small model"]
ID_PROMPTS = random_prompts([7, 15, 4], seed=11)


def _greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_dir)


@pytest.fixture
def llm(tiny_llama_dir: Path, make_llm):
    return make_llm(tiny_llama_dir)


def test_string_prompts_go_through_the_tokenizer(llm, tokenizer) -> None:
    by_text = llm.generate(TEXT_PROMPTS, _greedy())
    by_ids = llm.generate([tokenizer(p).input_ids for p in TEXT_PROMPTS], _greedy())
    for t, i in zip(by_text, by_ids, strict=True):
        assert t.token_ids == i.token_ids
        assert len(t.token_ids) == 24 and t.finish_reason == "length"
        assert t.text == tokenizer.decode(t.token_ids, skip_special_tokens=True)
    assert_idle_invariant(llm)


def test_max_tokens_finishes_with_length(llm) -> None:
    outs = llm.generate(ID_PROMPTS, [_greedy(n) for n in (1, 5, 13)])
    assert [len(o.token_ids) for o in outs] == [1, 5, 13]
    assert all(o.finish_reason == "length" for o in outs)


def _first_ascii_word(tokenizer, tokens: list[int]) -> tuple[str, int]:
    """A stop string (>= 2 ASCII letters decoded from one token, not the first token)."""
    for i in range(3, len(tokens)):
        piece = tokenizer.decode([tokens[i]]).strip()
        if len(piece) >= 2 and piece.isascii() and piece.isalpha():
            return piece, i
    raise AssertionError(f"no ASCII word among generated tokens {tokens}")


def test_stop_string_truncates_text(llm, tokenizer) -> None:
    prompt = TEXT_PROMPTS[1]
    full = llm.generate([prompt], _greedy(40))[0].token_ids
    stop, _ = _first_ascii_word(tokenizer, full)
    # The request must end on the first token whose text completes the stop string.
    n_stop = next(
        n for n in range(1, len(full) + 1) if stop in tokenizer.decode(full[:n], skip_special_tokens=True)
    )
    full_text = tokenizer.decode(full[:n_stop], skip_special_tokens=True)

    out = llm.generate([prompt], _greedy(40, stop=[stop, "never-generated-zzz"]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full[:n_stop]
    assert out.text == full_text[: full_text.index(stop)]
    assert stop not in out.text
    assert_idle_invariant(llm)


def test_stop_token_ids(llm) -> None:
    full = llm.generate([ID_PROMPTS[1]], _greedy(30))[0].token_ids
    stop_tok = full[6]
    first = full.index(stop_tok)
    out = llm.generate([ID_PROMPTS[1]], _greedy(30, stop_token_ids=[stop_tok]))[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == full[: first + 1], "generation ends with the stop token"


def _with_eos(src: Path, dst: Path, eos: int) -> Path:
    """Copy of a checkpoint whose config and generation config name `eos` as EOS."""
    shutil.copytree(src, dst)
    for name in ("config.json", "generation_config.json"):
        f = dst / name
        if f.exists():
            cfg = json.loads(f.read_text())
            cfg["eos_token_id"] = eos
            f.write_text(json.dumps(cfg, indent=2))
    return dst


def test_eos_stops_unless_ignored(tiny_llama_dir: Path, make_llm, tmp_path: Path) -> None:
    prompt = ID_PROMPTS[0]
    full = make_llm(tiny_llama_dir).generate([prompt], _greedy(30))[0].token_ids
    eos = full[8]
    first = full.index(eos)
    assert EOS_ID not in full[: first + 1]
    llm = make_llm(_with_eos(tiny_llama_dir, tmp_path / "m", eos))

    stopped = llm.generate([prompt], SamplingParams(max_tokens=30, temperature=0.0))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == full[: first + 1], "EOS is the last generated token"

    ignored = llm.generate([prompt], _greedy(30))[0]
    assert ignored.finish_reason == "length"
    assert ignored.token_ids == full
    assert_idle_invariant(llm)


def _sampled(seed: int | None, n: int = 20, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=1.0, seed=seed, ignore_eos=True, **kw)


def test_same_seed_same_tokens(llm) -> None:
    a = llm.generate([ID_PROMPTS[0]], _sampled(7))[0].token_ids
    b = llm.generate([ID_PROMPTS[0]], _sampled(7))[0].token_ids
    assert a == b


def test_seeded_request_independent_of_batch(llm) -> None:
    alone = llm.generate([ID_PROMPTS[0]], _sampled(7))[0].token_ids
    batch = llm.generate(ID_PROMPTS, [_sampled(7), _sampled(8), _sampled(None)])
    assert batch[0].token_ids == alone


def test_different_seeds_differ(llm) -> None:
    outs = [llm.generate([ID_PROMPTS[0]], _sampled(s, n=30))[0].token_ids for s in (1, 2, 3)]
    assert len({tuple(o) for o in outs}) == 3


def test_sampling_is_not_greedy(llm) -> None:
    greedy = llm.generate([ID_PROMPTS[2]], _greedy(30))[0].token_ids
    sampled = [llm.generate([ID_PROMPTS[2]], _sampled(s, n=30))[0].token_ids for s in (1, 2)]
    assert any(s != greedy for s in sampled)


def test_top_k_1_and_tiny_top_p_equal_greedy(llm) -> None:
    greedy = [o.token_ids for o in llm.generate(ID_PROMPTS, _greedy(20))]
    top_k = llm.generate(ID_PROMPTS, _sampled(5, top_k=1))
    top_p = llm.generate(ID_PROMPTS, _sampled(6, top_p=1e-6))
    assert [o.token_ids for o in top_k] == greedy
    assert [o.token_ids for o in top_p] == greedy
    assert_idle_invariant(llm)


def test_one_sampling_params_per_prompt(llm) -> None:
    params = [_greedy(5), _sampled(3, n=9), _greedy(7)]
    outs = llm.generate(ID_PROMPTS, params)
    assert [len(o.token_ids) for o in outs] == [5, 9, 7]
    assert outs[0].token_ids == llm.generate([ID_PROMPTS[0]], _greedy(5))[0].token_ids
    assert outs[2].token_ids == llm.generate([ID_PROMPTS[2]], _greedy(7))[0].token_ids
    assert outs[1].token_ids == llm.generate([ID_PROMPTS[1]], _sampled(3, n=9))[0].token_ids


def test_default_sampling_params(llm) -> None:
    outs = llm.generate(ID_PROMPTS[:1])
    assert len(outs) == 1 and 1 <= len(outs[0].token_ids) <= 16


def test_model_without_tokenizer_takes_token_ids(
    tiny_no_tokenizer_dir: Path, tiny_llama_dir: Path, make_llm
) -> None:
    """Same weights as tiny_llama_dir (same seed), but no tokenizer files."""
    assert not (tiny_no_tokenizer_dir / "tokenizer.json").exists()
    bare = make_llm(tiny_no_tokenizer_dir)
    outs = bare.generate(ID_PROMPTS, _greedy(12))
    refs = make_llm(tiny_llama_dir).generate(ID_PROMPTS, _greedy(12))
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    with pytest.raises((ValueError, RuntimeError), match="(?i)tokenizer"):
        bare.generate(["a string prompt needs a tokenizer"], _greedy(4))
    assert_idle_invariant(bare)


def test_sampler_reads_logits_in_the_model_dtype(tiny_llama_dir: Path, make_llm, monkeypatch) -> None:
    """Steps hand the sampler the lm_head product in the model dtype (no [B, vocab] fp32
    copy a step): bf16 here, and the greedy and seeded tokens are those of fp32 logits."""
    import torch

    from gearshift.models.llama import LlamaForCausalLM
    from gearshift.runner import model_runner

    seen, sample = [], model_runner.sample

    def spy(logits, sb):
        seen.append(logits.dtype)
        return sample(logits, sb)

    monkeypatch.setattr(model_runner, "sample", spy)
    params = [_greedy(12), SamplingParams(max_tokens=12, temperature=0.8, seed=3, ignore_eos=True)]
    llm = make_llm(tiny_llama_dir, dtype="bfloat16")
    got = [o.token_ids for o in llm.generate(ID_PROMPTS[:2], params)]
    assert seen and set(seen) == {torch.bfloat16}

    compute = LlamaForCausalLM.compute_logits
    monkeypatch.setattr(LlamaForCausalLM, "compute_logits",
                        lambda self, h, out=None, mm_out=None, fp32=True: compute(self, h, out, mm_out))
    seen.clear()
    want = [o.token_ids for o in make_llm(tiny_llama_dir, dtype="bfloat16").generate(ID_PROMPTS[:2], params)]
    assert set(seen) == {torch.float32} and got == want


def test_unseeded_request_reports_the_seed_that_replays_it(llm) -> None:
    drawn = llm.generate(ID_PROMPTS, [_sampled(None)] * len(ID_PROMPTS))
    seeds = [o.seed for o in drawn]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == len(seeds)
    again = llm.generate(ID_PROMPTS, [_sampled(s) for s in seeds])
    assert [o.token_ids for o in again] == [o.token_ids for o in drawn]
    assert [o.seed for o in again] == seeds
