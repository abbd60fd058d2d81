"""What a request's output must match: `StructuredOutput`, one constraint per request.

Data flow: SamplingParams.structured_output -> GrammarCompiler (compiler.py) -> a grammar
per request (matcher.py) -> token masks in every step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_CHOICES = 1024  # most strings `choice` may list


class StructuredOutputError(ValueError):
    """A constraint that cannot be compiled or is malformed. `field` names the part of the
    StructuredOutput it concerns ("json", "regex", "grammar", "choice" or "json_object");
    the server maps it to the request field the user sent."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """Exactly one of: a JSON schema (`json`: a dict or its JSON text), any JSON object
    (`json_object`), a regular expression (`regex`), an EBNF grammar (`grammar`, xgrammar's
    GBNF-style syntax with a `root` rule), or one of a list of strings (`choice`)."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    grammar: str | None = None
    choice: tuple[str, ...] | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        kinds = [k for k in ("json", "regex", "grammar", "choice") if getattr(self, k) is not None]
        kinds += ["json_object"] if self.json_object else []
        if len(kinds) != 1:
            raise StructuredOutputError(
                kinds[1] if kinds else None,
                "structured output takes exactly one of json, regex, grammar, choice and "
                f"json_object (got {', '.join(kinds) or 'none'})")
        if self.json is not None:
            object.__setattr__(self, "json", _schema_object(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise StructuredOutputError(name, f"{name} must be a non-empty string")
        if self.choice is not None:
            choice = self.choice
            if isinstance(choice, str) or not all(isinstance(c, str) and c for c in choice) \
                    or not 0 < len(choice) <= MAX_CHOICES:
                raise StructuredOutputError(
                    "choice", f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
            object.__setattr__(self, "choice", tuple(choice))

    @property
    def kind(self) -> str:
        """The constraint's field name."""
        if self.json_object:
            return "json_object"
        return next(k for k in ("json", "regex", "grammar", "choice") if getattr(self, k) is not None)


def _schema_object(schema: dict | str) -> dict:
    """A JSON schema as a dict (text is parsed); anything else is refused."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (json.JSONDecodeError, RecursionError) as e:
            raise StructuredOutputError("json", f"the JSON schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict):
        raise StructuredOutputError("json", "a JSON schema must be a JSON object")
    return schema
