"""Structured output's pieces without a model: the constraint's validation, compile errors
naming their field, the bitmask unpacked on the device side against a plain reference, and
the mask of every draft-tree node equal to the mask after accepting its path one token at a
time (a rejected node, and what hangs below it, never constrains anything).

Data flow (tests only): tests/checkpoints.build_tokenizer -> GrammarCompiler ->
RequestGrammar -> host bitmasks -> structured/mask.py.
"""

from __future__ import annotations

import pytest
import torch
from checkpoints import EOS_ID, VOCAB_SIZE, build_tokenizer

from gearshift.structured.compiler import GrammarCompiler, choice_grammar
from gearshift.structured.mask import blocked_tokens, constrain, draft_blocked
from gearshift.structured.matcher import GrammarViolation, tree_masks, unconstrained
from gearshift.structured.params import StructuredOutput, StructuredOutputError


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(build_tokenizer(), VOCAB_SIZE, (EOS_ID,))


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize(("fields", "field"), [
    ({}, None), (dict(regex="a", grammar="root ::= \"a\""), "grammar"),
    (dict(json="[1, 2]"), "json"), (dict(json="{"), "json"), (dict(choice="abc"), "choice"),
    (dict(choice=["a", ""]), "choice"), (dict(regex=""), "regex")])
def test_malformed_constraints_name_their_field(fields, field):
    with pytest.raises(StructuredOutputError) as e:
        StructuredOutput(**fields)
    assert e.value.field == field


def test_a_schema_may_come_as_text_and_choices_as_a_list():
    so = StructuredOutput(json='{"type": "object"}')
    assert so.json == {"type": "object"} and so.kind == "json"
    assert StructuredOutput(choice=["a", "b"]).choice == ("a", "b")


@pytest.mark.parametrize(("so", "field"), [
    (StructuredOutput(json={"type": "objectx"}), "json"),
    (StructuredOutput(json={"type": "string", "pattern": "(("}), "json"),
    (StructuredOutput(regex="(ab"), "regex"),
    (StructuredOutput(grammar="root ::= missing"), "grammar")])
def test_compile_errors_name_their_field(compiler, so, field):
    with pytest.raises(StructuredOutputError) as e:
        compiler.compile(so)
    assert e.value.field == field and "invalid" in str(e.value)
    assert ".cc:" not in str(e.value)  # xgrammar's source location is dropped


def test_choices_are_matched_exactly(compiler, tok):
    choices = ('say "hi"\n', "a\\b", "é")
    assert choice_grammar(choices) == 'root ::= "say \\"hi\\"\\n" | "a\\\\b" | "é"'
    for c in choices:
        g = compiler.grammar(StructuredOutput(choice=choices))
        for t in _ids(tok, c):
            g.accept(t)
        g.accept(EOS_ID)
        assert g.terminated
    g = compiler.grammar(StructuredOutput(choice=choices))
    with pytest.raises(GrammarViolation):
        for t in _ids(tok, "nope"):
            g.accept(t)


def _reference_allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    out = torch.zeros(bitmask.shape[0], vocab, dtype=torch.bool)
    for r in range(bitmask.shape[0]):
        for t in range(vocab):
            out[r, t] = bool((int(bitmask[r, t // 32]) >> (t % 32)) & 1)
        if not out[r].any():
            out[r] = True
    return out


def test_bitmask_unpacks_like_the_reference():
    gen = torch.Generator().manual_seed(0)
    vocab = 77  # not a multiple of 32: the last word's spare bits are ignored
    masks = torch.randint(-2**31, 2**31 - 1, (5, 3), generator=gen, dtype=torch.int64).to(torch.int32)
    masks[3] = 0  # allows nothing: left unconstrained
    masks[4] = -1
    allowed = _reference_allowed(masks, vocab)
    assert torch.equal(~blocked_tokens(masks, vocab), allowed)
    cols = torch.tensor([5, 70, 2])
    expected = allowed[:, cols] | ~allowed[:, cols].any(-1, keepdim=True)
    assert torch.equal(~draft_blocked(masks, vocab, cols, 3), expected)


def test_constrain_masks_and_lets_the_grammar_win_over_banned_tokens():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, float("-inf"), 0.0]])
    allowed = torch.tensor([[True, False, True], [False, True, False]])
    out = constrain(logits, ~allowed)
    assert out[0].tolist() == [1.0, float("-inf"), 3.0]
    assert out[1].tolist() == [float("-inf"), 0.0, float("-inf")]  # only a banned token allowed


def test_tree_masks_equal_sequential_masks_along_each_path(compiler, tok):
    so = StructuredOutput(json={"type": "object", "properties": {"a": {"enum": ["xy", "z"]}},
                                "required": ["a"]})
    prefix = _ids(tok, '{"a": ')
    t = {c: _ids(tok, c)[0] for c in ('"', "x", "z", "y", "}", "q")}
    #   0 (root) -> 1 '"' -> 2 'x' -> 4 'y'
    #                     -> 3 'z'
    #            -> 5 'q' (refused) -> 6 '"' (below a refused node)
    tokens = [prefix[-1], t['"'], t["x"], t["z"], t["y"], t["q"], t['"']]
    parents = [-1, 0, 1, 1, 2, 0, 5]
    g = compiler.grammar(so)
    for x in prefix:
        g.accept(x)
    masks = tree_masks([_Req(g)], [tokens], [parents], [len(tokens)], len(tokens), VOCAB_SIZE)
    ref = unconstrained(len(tokens), VOCAB_SIZE)
    paths = {0: [], 1: [1], 2: [1, 2], 3: [1, 3], 4: [1, 2, 4]}
    for node, path in paths.items():
        h = compiler.grammar(so)
        for x in prefix + [tokens[j] for j in path]:
            h.accept(x)
        h.fill(ref, node)
    allowed = ~blocked_tokens(masks, VOCAB_SIZE)
    assert torch.equal(allowed[:5], ~blocked_tokens(ref[:5], VOCAB_SIZE))
    assert allowed[5].all() and allowed[6].all()  # never accepted: unconstrained
    assert not allowed[0, t["q"]]  # the refused draft has probability 0 at its parent
    g.accept(t['"'])  # the walk rolled back: the matcher is where it started


class _Req:
    def __init__(self, grammar) -> None:
        self.grammar, self.is_finished = grammar, False
