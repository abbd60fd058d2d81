"""A request's structured-output fields -> the engine's StructuredOutput, compiled once off
the event loop (a schema can take tens of milliseconds): an invalid schema, regex or
grammar is a 400 naming the field before anything reaches the engine, and the engine's own
compile of the same constraint is a cache hit.

    response_format {"type": "json_object"}                  -> any JSON object
    response_format {"type": "json_schema", "json_schema": {"schema": ...}}
    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
                                                             (vLLM's extension)

Data flow: serving.prepare_* -> structured_output(engine, offload, req) ->
SamplingParams.structured_output.
"""

from __future__ import annotations

from gearshift.server.errors import APIError
from gearshift.server.protocol import ChatCompletionRequest, CompletionRequest
from gearshift.structured.params import StructuredOutput, StructuredOutputError


def requested(req: CompletionRequest | ChatCompletionRequest) -> tuple[StructuredOutput, str] | None:
    """The request's constraint and the field that asked for it (None: unconstrained)."""
    rf, so = req.response_format, req.structured_outputs
    if rf is not None and rf.type == "text":
        rf = None
    if rf is not None and so is not None:
        raise APIError(400, "send either response_format or structured_outputs, not both",
                       param="structured_outputs", code="invalid_value")
    if rf is not None:
        if rf.type == "json_object":
            return StructuredOutput(json_object=True), "response_format"
        param = "response_format.json_schema.schema"
        return _build(param, json=rf.json_schema.schema_), param
    if so is None:
        return None
    fields = {"json": so.json_, "regex": so.regex, "choice": so.choice, "grammar": so.grammar}
    fields = {k: v for k, v in fields.items() if v is not None}
    if so.json_object:
        fields["json_object"] = True
    built = _build("structured_outputs", **fields)
    return built, f"structured_outputs.{built.kind}"


def _build(param: str, **fields) -> StructuredOutput:
    try:
        return StructuredOutput(**fields)
    except StructuredOutputError as e:
        where = f"{param}.{e.field}" if e.field and param == "structured_outputs" else param
        raise APIError(400, f"invalid request: '{where}': {e}", param=where,
                       code="invalid_value") from None


async def structured_output(engine, offload, req: CompletionRequest | ChatCompletionRequest
                            ) -> StructuredOutput | None:
    """The request's constraint, compiled (and so checked) in the offload pool."""
    found = requested(req)
    if found is None:
        return None
    so, param = found
    if engine.grammars is None:
        raise APIError(400, f"'{param}': this engine has no structured output", param=param,
                       code="unsupported_parameter")
    try:
        await offload.always(engine.grammars.compile, so)
    except StructuredOutputError as e:
        raise APIError(400, f"invalid request: '{param}': {e}", param=param,
                       code="invalid_value") from None
    return so
