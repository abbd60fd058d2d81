"""Structured output on tiny random checkpoints: whatever the model prefers, the grammar
mask forces valid output. Sampled requests return JSON that validates against a schema
(nested objects, enums, arrays) with speculation off and on (EAGLE-3 chains and trees,
n-gram), overlapped or not; greedy output is the same with and without speculation; JSON
objects, regexes and choices hold; an invalid constraint is refused naming its field.

Data flow (tests only): LLM.generate(SamplingParams(structured_output=...)) -> engine ->
text -> json / jsonschema / re checks.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from checkpoints import EOS_ID
from eagle3_checkpoints import make_eagle3_checkpoint

from gearshift import SamplingParams, StructuredOutput
from gearshift.structured.params import StructuredOutputError

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1,
                 "maxItems": 3},
        "scores": {"type": "array", "maxItems": 4,
                   "items": {"type": "integer", "minimum": -50, "maximum": 50}},
        "parent": {"anyOf": [{"type": "null"}, {
            "type": "object", "properties": {"id": {"type": "integer", "minimum": 0,
                                                    "maximum": 99}},
            "required": ["id"], "additionalProperties": False}]},
    },
    "required": ["id", "name", "role", "active", "address", "tags"],
    "additionalProperties": False,
}
JSON_SCHEMA = StructuredOutput(json=SCHEMA)
PROMPTS = ["Describe the user:", "Once upon a time", "The quick brown fox", "Hello world!",
           "A small model", "Speculative decoding", "JSON please", "x"]
SPEC = {
    "off": {},
    "chain": dict(speculative_algorithm="eagle3", num_draft_tokens=3, spec_policy="always"),
    "tree": dict(speculative_algorithm="eagle3", num_draft_tokens=3, tree_width=2,
                 tree_budget=6, spec_policy="always"),
    "ngram": dict(speculative_algorithm="ngram", num_draft_tokens=3, spec_policy="always"),
}


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    return make_eagle3_checkpoint(tmp_path_factory.mktemp("head"), aux_layer_ids=[0, 1, 1])


def _llm(make_llm, model, head, spec: str, **kw):
    opts = dict(SPEC[spec])
    if opts.get("speculative_algorithm") == "eagle3":
        opts["draft_model"] = str(head)
    return make_llm(model, max_num_seqs=32, **opts, **kw)


def _valid(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value


@pytest.mark.parametrize(("spec", "count", "overlap"), [
    ("off", 200, True), ("chain", 200, True), ("tree", 64, True), ("ngram", 64, True),
    ("off", 32, False), ("chain", 32, False)])
def test_sampled_json_validates_against_the_schema(make_llm, tiny_llama_dir, head_dir, spec,
                                                   count, overlap):
    llm = _llm(make_llm, tiny_llama_dir, head_dir, spec, overlap_schedule=overlap)
    params = [SamplingParams(max_tokens=256, temperature=1.0, top_p=0.95 if i % 2 else 1.0,
                             seed=i, structured_output=JSON_SCHEMA) for i in range(count)]
    outs = llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(count)], params,
                        use_tqdm=False)
    for o in outs:
        assert o.finish_reason == "stop" and o.token_ids[-1] == EOS_ID, o.text
        _valid(o.text)
    if spec != "off":
        assert llm.spec_stats()["proposed"] > 0


def test_greedy_json_is_the_same_with_and_without_speculation(make_llm, tiny_llama_dir,
                                                              head_dir):
    params = SamplingParams(max_tokens=256, temperature=0.0, structured_output=JSON_SCHEMA)
    ref = [o.token_ids for o in _llm(make_llm, tiny_llama_dir, head_dir, "off").generate(
        PROMPTS, params, use_tqdm=False)]
    for spec in ("chain", "tree", "ngram"):
        for overlap in (True, False):
            llm = _llm(make_llm, tiny_llama_dir, head_dir, spec, overlap_schedule=overlap)
            got = [o.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            assert got == ref, (spec, overlap)


@pytest.mark.parametrize("spec", ["off", "chain"])
def test_json_object_regex_and_choice(make_llm, tiny_llama_dir, head_dir, spec):
    llm = _llm(make_llm, tiny_llama_dir, head_dir, spec)
    choices = ("yes", "no", "maybe not", 'say "hi"\n')
    kinds = [StructuredOutput(json_object=True), StructuredOutput(regex=r"[a-z]{3}-[0-9]{2,4}"),
             StructuredOutput(choice=choices)]
    # the random model never closes a free-form string or object by itself: a bias on '"'
    # and '}' does, wherever the grammar allows them
    bias = {llm.tokenizer.convert_tokens_to_ids(t): 6.0 for t in ('"', "}")}
    params = [SamplingParams(max_tokens=200, temperature=t, seed=i, structured_output=so,
                             logit_bias=bias if so.json_object else None)
              for i, (so, t) in enumerate((so, t) for so in kinds for t in (0.0, 1.0, 1.0))]
    outs = llm.generate(PROMPTS[: len(params)] + PROMPTS[: len(params) - len(PROMPTS)], params,
                        use_tqdm=False)
    for o, p in zip(outs, params):
        so = p.structured_output
        assert o.finish_reason == "stop", o.text
        if so.json_object:
            assert isinstance(json.loads(o.text), dict)
        elif so.regex:
            assert re.fullmatch(so.regex, o.text), o.text
        else:
            assert o.text in choices


@pytest.mark.parametrize("spec", ["off", "chain", "tree"])
def test_the_grammar_ends_the_request_whatever_eos_options_say(make_llm, tiny_llama_dir,
                                                               head_dir, spec):
    llm = _llm(make_llm, tiny_llama_dir, head_dir, spec)
    so = StructuredOutput(choice=("ok",))
    for extra in (dict(ignore_eos=True), dict(min_tokens=8), dict(ignore_eos=True, min_tokens=8)):
        for t in (0.0, 1.0):
            out = llm.generate(PROMPTS[0], SamplingParams(max_tokens=50, temperature=t,
                                                          structured_output=so, **extra),
                               use_tqdm=False)[0]
            assert (out.text, out.finish_reason) == ("ok", "stop"), (extra, t)


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(make_llm, tiny_llama_dir,
                                                                      head_dir):
    plain = SamplingParams(max_tokens=24, temperature=0.8, seed=5, ignore_eos=True)
    for spec in ("off", "chain"):
        llm = _llm(make_llm, tiny_llama_dir, head_dir, spec)
        alone = llm.generate(PROMPTS[:3], plain, use_tqdm=False)
        constrained = SamplingParams(max_tokens=256, temperature=0.0, structured_output=JSON_SCHEMA)
        mixed = llm.generate(PROMPTS[:3] * 2, [plain] * 3 + [constrained] * 3, use_tqdm=False)
        assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in alone], spec
        for o in mixed[3:]:
            _valid(o.text)


@pytest.mark.parametrize(("so", "field"), [
    (dict(json={"type": "objectx"}), "json"), (dict(regex="(ab"), "regex"),
    (dict(grammar="root ::= undefined_rule"), "grammar"), (dict(json="{not json"), "json"),
    (dict(choice=[]), "choice"), (dict(regex="a", choice=["a"]), "choice")])
def test_an_invalid_constraint_is_refused_naming_its_field(make_llm, tiny_llama_dir, so, field):
    llm = make_llm(tiny_llama_dir)
    with pytest.raises(StructuredOutputError) as e:
        llm.generate(PROMPTS[0], SamplingParams(structured_output=StructuredOutput(**so)),
                     use_tqdm=False)
    assert e.value.field == field
