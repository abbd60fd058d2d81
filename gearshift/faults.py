"""A failure that concerns one request of a step: the engine fails that request alone.

Data flow: runner/batch.py, structured/matcher.py raise -> engine/engine.py fails the request.
"""

from __future__ import annotations


class RequestFault(Exception):
    """Processing one request of a step failed (raised with the request it concerns, `req`: a
    Request, left unannotated so that this module imports nothing): the engine fails that
    request alone and keeps serving the others."""

    def __init__(self, req, cause: BaseException) -> None:
        super().__init__(f"request {req.request_id!r}: {type(cause).__name__}: {cause}")
        self.req, self.cause = req, cause
