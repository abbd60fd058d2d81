"""Byte-level BPE tokenizer for the default model, trained on the stdlib corpus.

Data flow (default model):  corpus.py (train split texts) -> tokenizer.py
-> tokenizer.json + tokenizer_config.json + special_tokens_map.json (loaded by
`transformers.AutoTokenizer`) -> encode_split() -> uint16 token ids for tiny_lm.py / eagle3.

The pre-tokenizer is the Llama-3 / cl100k regex followed by byte-level mapping, so any
byte string round-trips and no token is unknown. Training is deterministic given the
corpus (sorted files, fixed vocabulary size, fixed special tokens).

Usage: python -m gearshift.train.tokenizer --out DIR [--vocab-size 8192]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from gearshift.train import corpus

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, PAD, *ROLE_TOKENS)  # ids 0..5, in this order
DEFAULT_VOCAB_SIZE = 8192
MODEL_MAX_LENGTH = 2048

# Llama-3 / cl100k split: contractions, words, 1-3 digit groups, punctuation runs,
# newlines (with the indentation before them), other whitespace runs.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# One turn: "<|role|>\n{content}<|eos|>\n"; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|eos|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _add_bos_processor(tok: Tokenizer) -> None:
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS}:0 $A:0",
                pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1",
                special_tokens=[(BOS, bos_id)],
            ),
        ]
    )


def train_tokenizer(texts: Iterable[str], vocab_size: int = DEFAULT_VOCAB_SIZE) -> Tokenizer:
    """Train a byte-level BPE on `texts`; special tokens take ids 0..5."""
    tok = _new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    _add_bos_processor(tok)
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: str | Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    special_map = {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": list(ROLE_TOKENS),
    }
    added = {
        str(i): {
            "content": name,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, name in enumerate(SPECIAL_TOKENS)
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        **special_map,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return out


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The raw `tokenizers.Tokenizer` from a directory (or a tokenizer.json path)."""
    p = Path(path)
    return Tokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p))


def encode_texts(tok: Tokenizer, texts: list[str], batch: int = 64) -> np.ndarray:
    """Concatenate `<|bos|> text <|eos|>` for every text, as a flat uint16 array."""
    assert tok.get_vocab_size() <= np.iinfo(np.uint16).max + 1
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    chunks: list[np.ndarray] = []
    for start in range(0, len(texts), batch):
        for enc in tok.encode_batch(texts[start : start + batch], add_special_tokens=False):
            chunks.append(np.asarray([bos, *enc.ids, eos], dtype=np.uint16))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)


def encode_split(tok: Tokenizer, split: str, max_files: int | None = None) -> np.ndarray:
    """Token ids (uint16) of one corpus split, files in sorted order."""
    return encode_texts(tok, corpus.load_texts(split, max_files))


def main() -> None:
    ap = argparse.ArgumentParser(description="Train the default byte-level BPE tokenizer.")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    ap.add_argument("--max-files", type=int, default=None, help="first N train files only")
    args = ap.parse_args()
    tok = train_tokenizer(corpus.load_texts("train", args.max_files), args.vocab_size)
    out = save_tokenizer(tok, args.out)
    print(f"saved {tok.get_vocab_size()}-token tokenizer to {out}")


if __name__ == "__main__":
    main()
