"""OpenAI request fields Gearshift does not implement, with the values that ask for nothing.

Clients often send a field at its default (`"store": false`, `"tool_choice": "none"`): such
a value is accepted and dropped; any other value is a 400 naming the field
(`unsupported_parameter`), never a silent no-op. Keys that are neither OpenAI fields nor
Gearshift extensions are refused as unknown by the models' `extra="forbid"`, as the OpenAI
API refuses them. A field a protocol model declares is that model's to validate: the
entries below only apply while it is not declared.

Data flow: protocol.py `_Strict` (before validation) -> drop_neutral(model name, body) ->
the body without neutral fields, or PydanticCustomError -> errors.py -> 400.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticCustomError

# protocol model -> {field: the values accepted as "nothing asked" (null always is)}
UNSUPPORTED: dict[str, dict[str, tuple]] = {
    "ChatCompletionRequest": {
        "audio": (),
        "function_call": ("none",),
        "functions": ([],),
        "metadata": ({},),  # goes with store
        "modalities": (["text"],),
        "moderation": (),
        "parallel_tool_calls": (True, False),  # no tools: nothing to call in parallel
        "prediction": (),
        "prompt_cache_key": (),
        "prompt_cache_options": (),
        "prompt_cache_retention": (),
        "reasoning_effort": ("none",),
        "service_tier": ("auto", "default"),
        "store": (False,),
        "tool_choice": ("none", "auto"),  # no tools: either means no call
        "verbosity": ("medium",),
        "web_search_options": (),
    },
    "ChatMessage": {
        "audio": (),
        "function_call": (),
        "refusal": (),
        "tool_call_id": (),
        "tool_calls": ([],),
    },
    "StreamOptions": {
        "include_obfuscation": (False,),
    },
}


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same JSON type (0 is not false, 1.0 is not true)."""
    return type(value) is type(neutral) and value == neutral


def drop_neutral(model: str, data: Any, declared: dict) -> Any:
    """`data` without the unsupported fields of `model` that ask for nothing; a pydantic
    error of type `unsupported_parameter` (ctx: the field) for one that asks for more."""
    table = UNSUPPORTED.get(model)
    if not table or not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        if key in declared or key not in table or value is None:
            out[key] = value
            continue
        accepted = table[key]
        if not any(_same(value, n) for n in accepted):
            neutral = " or ".join(json.dumps(n) for n in accepted)
            hint = f" (accepted only as {neutral})" if accepted else ""
            raise PydanticCustomError(
                "unsupported_parameter", "'{field}' is not supported by this server{hint}",
                {"field": key, "hint": hint})
    return out
