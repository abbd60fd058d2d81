"""Structured output through the server (speculating with an EAGLE-3 head): the official
`openai` client's response_format (JSON schema, JSON object, `parse` with a pydantic model)
and vLLM's structured_outputs (regex, choice) hold in complete responses and in streams;
greedy JSON equals the plain engine's; invalid constraints are a 400 naming the field.

Data flow (tests only): openai / httpx -> live server (BackgroundServer) -> Engine ->
response text -> json / jsonschema / re checks.
"""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from checkpoints import build_tokenizer
from eagle3_checkpoints import make_eagle3_checkpoint
from pydantic import BaseModel, Field
from test_structured_output import SCHEMA

from gearshift import SamplingParams, StructuredOutput
from gearshift.engine.engine import Engine
from gearshift.frontend.async_engine import AsyncEngine
from gearshift.llm import LLM, build_engine_config
from gearshift.server.app import build_app
from gearshift.server.background import BackgroundServer

OPTS = dict(device="cpu", dtype="float32", attention_backend="torch", max_num_seqs=16,
            kv_cache_tokens=4096)
MESSAGES = [{"role": "user", "content": "Describe a user as JSON."}]
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA}}


class User(BaseModel):
    role: Literal["admin", "user", "guest"]
    age: int = Field(ge=0, le=120)
    tags: list[Literal["a", "b"]] = Field(max_length=2)


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    head = make_eagle3_checkpoint(tmp_path_factory.mktemp("h"), aux_layer_ids=[0, 1, 1])
    engine = Engine(build_engine_config(str(tiny_llama_dir), speculative_algorithm="eagle3",
                                        draft_model=str(head), num_draft_tokens=3,
                                        spec_policy="always", **OPTS))
    with BackgroundServer(build_app(AsyncEngine(engine))) as srv:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)
        yield srv, client, engine.model_name


def test_json_schema_in_chat_and_streams_matches_the_plain_engine(server, tiny_llama_dir):
    srv, client, model = server
    llm = LLM(str(tiny_llama_dir), **OPTS)
    ref = llm.chat(MESSAGES, SamplingParams(max_tokens=300, temperature=0.0,
                                            structured_output=StructuredOutput(json=SCHEMA)),
                   use_tqdm=False)[0].text
    jsonschema.validate(json.loads(ref), SCHEMA)
    out = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0,
                                         max_tokens=300, response_format=JSON_FORMAT)
    assert out.choices[0].message.content == ref and out.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=model, messages=MESSAGES, temperature=0,
                                            max_tokens=300, response_format=JSON_FORMAT,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ref
    sampled = client.chat.completions.create(model=model, messages=MESSAGES, n=4, seed=3,
                                             max_tokens=300, response_format=JSON_FORMAT)
    for choice in sampled.choices:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_parse_with_a_pydantic_model_and_json_object(server):
    _, client, model = server
    out = client.chat.completions.parse(model=model, messages=MESSAGES, max_tokens=100,
                                        temperature=0.7, seed=1, response_format=User)
    assert isinstance(out.choices[0].message.parsed, User)
    tok = build_tokenizer()  # the model's: a bias on '"' and '}' closes strings and objects
    bias = {str(i): 6 for i in tok.convert_tokens_to_ids(['"', "}"])}
    out = client.completions.create(model=model, prompt="JSON:", max_tokens=200, seed=2,
                                    logit_bias=bias,
                                    extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(out.choices[0].text), dict)


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_regex_and_choice(server, stream):
    _, client, model = server
    cases = [({"regex": "[a-z]{2,5}@[a-z]{3}\\.(com|org)"},
              lambda t: re.fullmatch("[a-z]{2,5}@[a-z]{3}\\.(com|org)", t)),
             ({"choice": ["red", "green", "blue"]}, lambda t: t in ("red", "green", "blue"))]
    for constraint, check in cases:
        out = client.completions.create(model=model, prompt="Answer:", max_tokens=40, n=3,
                                        seed=4, stream=stream,
                                        extra_body={"structured_outputs": constraint})
        texts = ["", "", ""]
        for part in (out if stream else [out]):
            for c in part.choices:
                texts[c.index] += c.text
        assert all(check(t) for t in texts), texts


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                 "schema": {"type": "objectx"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": "root ::= nothing_here"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"json": "{oops"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
])
def test_invalid_constraints_are_a_400_naming_the_field(server, body, param):
    srv, _, _ = server
    for path, base in (("/v1/chat/completions", {"messages": MESSAGES}),
                       ("/v1/completions", {"prompt": "x"})):
        r = httpx.post(srv.base_url + path, json={**base, **body}, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["param"], err["code"]) == (param, "invalid_value"), err


def test_sampled_json_streams_validate(server):
    _, client, model = server
    stream = client.chat.completions.create(model=model, messages=MESSAGES, n=16, seed=9,
                                            max_tokens=300, response_format=JSON_FORMAT,
                                            stream=True)
    texts = [""] * 16
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    for t in texts:
        jsonschema.validate(json.loads(t), SCHEMA)
