"""OutputProcessor: incremental UTF-8-safe text, stop strings with hold-back."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gearshift.frontend.output_processor import OutputProcessor
from gearshift.request import SamplingParams
from gearshift.scheduler.scheduler import StepOutput


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer with one token per byte: multi-byte characters span tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def feed(text, params, finish_last=True):
    tok = byte_tokenizer()
    ids = tok.encode(text)
    proc = OutputProcessor(tok)
    proc.add("r", [1], params)
    deltas = []
    for i, t in enumerate(ids):
        last = finish_last and i == len(ids) - 1
        d = proc.process(StepOutput("r", [t], last, "length" if last else None))
        deltas.append(d)
        if d.finished:
            break
    return deltas, proc.final("r")


def test_streamed_text_reassembles_and_never_splits_utf8():
    text = "héllo wörld — 日本語 🙂 done"
    deltas, final = feed(text, SamplingParams())
    assert "".join(d.new_text for d in deltas) == text == final.text
    assert all("\ufffd" not in d.new_text for d in deltas)


def test_stop_string_truncates_and_holds_back_partial_matches():
    deltas, final = feed("abc STOP def", SamplingParams(stop=["STOP"]))
    assert final.text == "abc " and final.finish_reason == "stop"
    assert deltas[-1].stop_hit and deltas[-1].finished
    assert "".join(d.new_text for d in deltas) == "abc "
    # text that merely starts like a stop string is released at the end
    deltas, final = feed("abc STO", SamplingParams(stop=["STOP"]))
    assert "".join(d.new_text for d in deltas) == "abc STO" == final.text
    assert final.finish_reason == "length"
