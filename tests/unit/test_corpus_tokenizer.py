"""Corpus splits (gearshift/train/corpus.py) and the BPE tokenizer (tokenizer.py).

The tokenizer is trained here on a small corpus subset (vocab 512) to stay fast; the
shipped 8k tokenizer of the default model is checked for round-trips and HF loading.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gearshift.train import corpus
from gearshift.train import tokenizer as tk

SHIPPED = Path(__file__).resolve().parents[2] / "gearshift" / "default_model" / "target"
SAMPLES = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1)\n",
    "x = {'a': [1, 2, 3]}\t# tabs, unicode: é ü 中文 🙂\r\n",
    "   leading spaces and trailing   ",
    "",
]


def test_splits_are_fixed_disjoint_and_sorted() -> None:
    files = list(corpus.iter_files())
    rels = [f.relpath for f in files]
    assert rels == sorted(rels) and len(rels) == len(set(rels)) > 500
    assert not any("site-packages" in r for r in rels)
    by_split = {s: [f.relpath for f in corpus.iter_files(s)] for s in corpus.SPLITS}
    assert sum(len(v) for v in by_split.values()) == len(rels)
    assert 0.005 < len(by_split["heldout"]) / len(rels) < 0.05
    assert 0.005 < len(by_split["val"]) / len(rels) < 0.05
    # The split depends only on the relative path: same answer on any machine.
    assert corpus.split_of("os.py") == corpus.split_of("os.py")
    assert all(corpus.split_of(r) == "heldout" for r in by_split["heldout"])
    assert [f.relpath for f in corpus.iter_files("train", max_files=5)] == by_split["train"][:5]


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    texts = corpus.load_texts("train", max_files=30)
    tok = tk.train_tokenizer(texts, vocab_size=512)
    return texts, tok, tk.save_tokenizer(tok, tmp_path_factory.mktemp("tok"))


def test_training_is_deterministic(small_tokenizer) -> None:
    texts, tok, _ = small_tokenizer
    again = tk.train_tokenizer(texts, vocab_size=512)
    assert again.to_str() == tok.to_str()
    assert tok.get_vocab_size() == 512
    assert [tok.token_to_id(t) for t in tk.SPECIAL_TOKENS] == list(range(6))


def test_round_trip_and_hf_loading(small_tokenizer) -> None:
    texts, tok, path = small_tokenizer
    hf = AutoTokenizer.from_pretrained(path)
    assert hf.bos_token_id == 0 and hf.eos_token_id == 1 and hf.pad_token_id == 2
    for text in [*SAMPLES, texts[0][:2000]]:
        ids = hf(text)["input_ids"]
        assert ids[0] == hf.bos_token_id  # the post-processor prepends <|bos|>
        assert hf.decode(ids, skip_special_tokens=True) == text
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids) == text
    flat = tk.encode_texts(tok, SAMPLES[:2])
    assert flat.dtype.name == "uint16" and flat[0] == 0 and flat[-1] == 1
    assert int((flat == 0).sum()) == 2  # one <|bos|> per document


def test_chat_template(small_tokenizer) -> None:
    _, _, path = small_tokenizer
    hf = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|system|>\nBe brief.<|eos|>\n<|user|>\nhi<|eos|>\n<|assistant|>\n"
    ids = hf(text, add_special_tokens=False)["input_ids"]
    assert ids[:2] == [0, hf.convert_tokens_to_ids("<|system|>")]


@pytest.mark.skipif(not (SHIPPED / "tokenizer.json").exists(), reason="no shipped tokenizer")
def test_shipped_tokenizer_round_trips() -> None:
    hf = AutoTokenizer.from_pretrained(SHIPPED)
    assert len(hf) == tk.DEFAULT_VOCAB_SIZE
    for text in SAMPLES:
        assert hf.decode(hf(text)["input_ids"], skip_special_tokens=True) == text
    code = "import os\n\n\ndef main():\n    return os.path.join('a', 'b')\n"
    assert len(hf(code)["input_ids"]) < len(code) / 2.5  # a real code vocabulary
