"""Host cost of structured output's token masks (gearshift/structured/): microseconds per
token for a typical JSON schema (nested object, enums, arrays, a bounded string pattern),
at several batch sizes, on this machine's CPU.

    plain step   step_masks: one mask per constrained request (the engine's own call)
    VERIFY step  tree_masks: a mask per drafted node, the matcher walking each node's path
                 (a chain of K drafts: K + 1 masks per request)
    commit       RequestGrammar.accept per token

Every request follows one valid document token by token (what a constrained request
emits), so each mask is computed at a real parser state. The tokenizer sets the cost
(xgrammar's masks scale with the vocabulary): `--tokenizer DIR` (any Hugging Face
tokenizer, e.g. Llama 3's 128k), or `--train-vocab N` trains a byte-level BPE of N tokens
over this Python's standard library sources (no download; about a minute for 128k).
Default: the embedded default model's tokenizer.

Usage: python benchmarks/bench_grammar_mask.py --train-vocab 128000 --batch 1 32 \
           --out grammar_mask.json
"""

from __future__ import annotations

import argparse
import json
import sysconfig
import time
from pathlib import Path

import torch

from gearshift.structured.compiler import GrammarCompiler
from gearshift.structured.matcher import step_masks, tree_masks
from gearshift.structured.params import StructuredOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,40}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "scores": {"type": "array", "items": {"type": "number"}},
    },
    "required": ["name", "age", "role", "address", "tags", "scores"],
}
DOCUMENT = {"name": "Ada Lovelace", "age": 36, "role": "admin",
            "address": {"city": "London", "zip": "12345"},
            "tags": ["math", "engines", "poetry"], "scores": [9.5, 8.25, 10]}


def train_tokenizer(vocab: int):
    """A byte-level BPE of `vocab` tokens over the standard library's Python sources."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((f.read_text(errors="ignore") for f in files), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def load_tokenizer(args):
    if args.train_vocab:
        return train_tokenizer(args.train_vocab)
    from transformers import AutoTokenizer

    if args.tokenizer:
        return AutoTokenizer.from_pretrained(args.tokenizer)
    from gearshift.models.default import DEFAULT_MODEL_DIR

    return AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR / "target")


class _Req:  # what step_masks / tree_masks read of a request
    def __init__(self, grammar) -> None:
        self.grammar, self.is_finished = grammar, False


def measure(compiler: GrammarCompiler, so: StructuredOutput, ids: list[int], batch: int,
            drafts: int) -> dict:
    """Request i starts i / batch of the way into the document (a batch's requests sit at
    different parser states) and starts over when it ends; every request visits every
    position once."""
    n_ids, n_tree = len(ids), drafts + 1
    reqs = [_Req(compiler.grammar(so)) for _ in range(batch)]
    cursor = [i * n_ids // batch for i in range(batch)]
    for r, c in zip(reqs, cursor):
        for t in ids[:c]:
            r.grammar.accept(t)
    sample, chain = [True] * batch, list(range(-1, drafts))
    plain = verify = accept = 0.0
    for _ in range(n_ids):
        t0 = time.perf_counter()
        step_masks(reqs, sample, 0)
        t1 = time.perf_counter()
        # the chains a perfect draft would propose, behind each pending token
        ahead = [ids[c:c + drafts] for c in cursor]
        tokens = [[0, *a] + [0] * (drafts - len(a)) for a in ahead]
        tree_masks(reqs, tokens, [chain] * batch, [1 + len(a) for a in ahead], n_tree,
                   compiler.vocab_size)
        t2 = time.perf_counter()
        for i, r in enumerate(reqs):
            r.grammar.accept(ids[cursor[i]])
        t3 = time.perf_counter()
        plain, verify, accept = plain + t1 - t0, verify + t2 - t1, accept + t3 - t2
        for i, r in enumerate(reqs):
            cursor[i] += 1
            if cursor[i] == n_ids:  # the request ended: a new one starts
                r.grammar.matcher.reset()
                cursor[i] = 0
    n = n_ids * batch
    return {"batch": batch, "tokens": n_ids, "plain_us_per_token": plain / n * 1e6,
            "plain_us_per_step": plain / n_ids * 1e6,
            "verify_us_per_node": verify / (n * n_tree) * 1e6,
            "verify_us_per_step": verify / n_ids * 1e6,
            "accept_us_per_token": accept / n * 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer directory")
    p.add_argument("--train-vocab", type=int, help="train a byte-level BPE of this size")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    p.add_argument("--drafts", type=int, default=3, help="chain length of the VERIFY case")
    p.add_argument("--repeat", type=int, default=3, help="runs per batch size (best kept)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    torch.set_num_threads(1)
    tok = load_tokenizer(args)
    vocab = len(tok)
    compiler = GrammarCompiler(tok, vocab, (tok.eos_token_id,))
    so = StructuredOutput(json=SCHEMA)
    t0 = time.perf_counter()
    compiler.compile(so)
    compile_ms = (time.perf_counter() - t0) * 1e3  # the tokenizer's set-up included
    t0 = time.perf_counter()
    compiler.compile(so)
    cached_ms = (time.perf_counter() - t0) * 1e3
    text = json.dumps(DOCUMENT)
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    rows = []
    for b in args.batch:
        runs = [measure(compiler, so, ids, b, args.drafts) for _ in range(args.repeat)]
        rows.append(min(runs, key=lambda r: r["plain_us_per_token"]))
    print(f"vocabulary {vocab}, document {len(ids)} tokens, first compile {compile_ms:.0f} ms "
          f"(tokenizer set-up included), cached {cached_ms:.3f} ms")
    print(f"{'batch':>5} {'plain us/token':>15} {'plain us/step':>14} {'verify us/node':>15} "
          f"{'verify us/step':>15} {'accept us/token':>16}")
    for r in rows:
        print(f"{r['batch']:>5} {r['plain_us_per_token']:>15.1f} {r['plain_us_per_step']:>14.0f} "
              f"{r['verify_us_per_node']:>15.1f} {r['verify_us_per_step']:>15.0f} "
              f"{r['accept_us_per_token']:>16.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"vocab": vocab, "drafts": args.drafts,
                                              "compile_ms": compile_ms, "cached_ms": cached_ms,
                                              "results": rows}, indent=2))


if __name__ == "__main__":
    main()
