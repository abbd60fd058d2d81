"""Errors in the OpenAI shape: every failure the server reports, from a malformed body to a
full waiting queue, leaves as `{"error": {"message", "type", "param", "code"}}`.

Data flow: request handler raises APIError (or FastAPI/Starlette raise their own) ->
exception handlers registered by `install_error_handlers` -> JSON response.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("gearshift.server")

# HTTP status -> OpenAI error type
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    500: "internal_server_error",
    503: "overloaded_error",
}


class APIError(Exception):
    """An error the client should see, with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    error_type = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(err.status, err.message, err.param, err.code),
        status_code=err.status,
        headers=err.headers,
    )


def from_validation_error(exc: ValidationError | RequestValidationError) -> APIError:
    """The first pydantic error, as a 400 naming the offending field.

    pydantic reports a union field once per member (loc `prompt.str`, `prompt.list[int]`,
    ...): those are folded into one message listing the accepted types.
    """
    errors = exc.errors()
    if not errors:
        return APIError(400, f"invalid request: {exc}", code="invalid_value")
    first = errors[0]
    path, tag = _split_loc(first.get("loc", ()))
    field = ".".join(path) or None
    if first.get("type") == "unsupported_parameter":  # openai_fields.py: loc is the parent
        field = ".".join([*path, first["ctx"]["field"]])
        return APIError(400, f"invalid request: '{field}' is not supported by this server"
                        f"{first['ctx']['hint']}", param=field, code="unsupported_parameter")
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"invalid request: unknown field '{field}' (neither an OpenAI "
                        "field nor a Gearshift extension)", param=field, code="unknown_parameter")
    where = f"'{field}': " if field else ""
    if tag is not None:
        tags = [t for e in errors if (p_t := _split_loc(e.get("loc", ())))[0] == path
                and (t := p_t[1]) is not None]
        expected = " or ".join(dict.fromkeys(tags))
        msg = f"invalid value {_short(first.get('input'))}; expected {expected}"
    else:
        msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return APIError(400, f"invalid request: {where}{msg}", param=field, code="invalid_value")


def _split_loc(loc: tuple) -> tuple[list[str], str | None]:
    """('messages', 0, 'content', 'list[TextPart]', 1) -> (['messages', '0', 'content'], tag)."""
    path: list[str] = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, str) and _is_type_tag(part):
            return path, part
        path.append(str(part))
    return path, None


def _is_type_tag(part: str) -> bool:
    return part in ("str", "int", "float", "bool", "dict", "list") or "[" in part or (
        part.startswith("function-")
    )


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(from_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error while serving a request")
        return JSONResponse(
            error_body(500, f"internal error: {type(exc).__name__}: {exc}"), status_code=500
        )
