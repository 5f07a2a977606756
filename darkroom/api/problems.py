"""Errors as RFC 9457 `application/problem+json`, with stable types.

A problem's `type` is a fixed URI per kind of error, so clients branch on it rather than
on prose. `detail` is always a fixed sentence written here, never an exception's text:
exceptions can carry paths, SQL, store URLs or credentials, and those go to the log only.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import psycopg_pool
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from darkroom.errors import StorageError

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://darkroom.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"

# slug -> title; the slugs are part of the contract: never rename one.
TITLES: dict[str, str] = {
    "unauthorized": "Unauthorized",
    "forbidden": "Forbidden",
    "not_found": "Not Found",
    "method_not_allowed": "Method Not Allowed",
    "conflict": "Conflict",
    "not_ready": "Derivative Not Ready",
    "payload_too_large": "Payload Too Large",
    "unsupported_media_type": "Unsupported Media Type",
    "validation_error": "Validation Error",
    "version_not_found": "Version Not Found",
    "digest_mismatch": "Digest Mismatch",
    "idempotency_key_reused": "Idempotency Key Reused",
    "storage_unavailable": "Storage Unavailable",
    "database_unavailable": "Database Unavailable",
    "not_ready_to_serve": "Not Ready",
    "internal_error": "Internal Server Error",
    "quota_exceeded": "Quota Exceeded",
    "not_retryable": "Not Retryable",
    "size_mismatch": "Size Mismatch",
    "too_many_requests": "Too Many Requests",
    "request_timeout": "Request Timeout",
    "headers_too_large": "Request Header Fields Too Large",
    "over_capacity": "Service Unavailable",
    "http_error": "HTTP Error",
}


class Problem(Exception):
    """Raised by a route to answer with a problem document."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(slug)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.headers = headers
        self.extra = extra


def problem_body(status: int, slug: str, detail: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": PROBLEM_BASE + slug,
        "title": TITLES.get(slug, TITLES["http_error"]),
        "status": status,
    }
    if detail is not None:
        body["detail"] = detail
    body.update(extra)
    return body


def problem_response(
    status: int,
    slug: str,
    detail: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    return JSONResponse(
        problem_body(status, slug, detail, **extra),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


# Every "no such file" answer is this one, byte for byte: a missing id, a malformed id
# and another owner's id must be indistinguishable.
def not_found() -> Problem:
    return Problem(404, "not_found", "No such file.")


def invalid_field(field: str, message: str, *, slug: str = "validation_error",
                  detail: str = "The request is not valid.") -> Problem:
    """A 422 that names the one field at fault, in the shape of every validation error."""
    return Problem(422, slug, detail, errors=[{"field": field, "message": message}])


def documented(description: str) -> dict[str, Any]:
    """The OpenAPI declaration of one problem answer."""
    return {
        "description": description,
        "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


_DESCRIPTIONS = {
    401: "No API key, or not a valid one.",
    403: "The key is valid but not allowed here.",
    404: "No such file (or it belongs to another owner).",
    409: "The file is not in a state that allows this.",
    413: "Larger than the upload limit.",
    422: "The request is not valid; `errors` names the fields.",
    429: "Too many requests; `Retry-After` says when to try again.",
    503: "The database or the object store is unavailable.",
}


def problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the problem answers a route can give (503 always)."""
    return {status: documented(_DESCRIPTIONS[status]) for status in (*statuses, 503)}


_STATUS_SLUGS = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}

_STATUS_DETAILS = {404: "No such resource.", 405: "This method is not allowed here."}


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("body", "size") -> "size"; ("query", "limit") -> "limit"; a whole-body error -> "body"
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_message(error: dict[str, Any]) -> str:
    # pydantic messages describe the constraint, never echo the input; keep them short.
    return str(error.get("msg", "invalid value"))[:200].removeprefix("Value error, ")


def install(app: FastAPI) -> None:
    """Turn every error the app can meet into a problem document."""

    async def on_problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc.status, exc.slug, exc.detail, headers=exc.headers, **exc.extra)

    async def on_http(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode at all (e.g. not UTF-8); the same
            # 422 as a body that is not valid JSON, so clients meet one shape for both.
            return problem_response(
                422,
                "validation_error",
                "The request is not valid.",
                errors=[{"field": "body", "message": "the body could not be decoded"}],
            )
        slug = _STATUS_SLUGS.get(exc.status_code, "http_error")
        return problem_response(
            exc.status_code,
            slug,
            _STATUS_DETAILS.get(exc.status_code),
            headers=dict(exc.headers or {}) or None,
        )

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = [
            {"field": _field_name(e.get("loc", ())), "message": _validation_message(e)}
            for e in exc.errors()
        ]
        return problem_response(422, "validation_error", "The request is not valid.", errors=errors)

    def unavailable(what: str, name: str) -> Any:
        """A 503 for an outage of `what`; the exception's text goes to the log only."""

        async def handler(request: Request, exc: Exception) -> JSONResponse:
            log.warning("%s error on %s %s: %s: %s", what, request.method, _route(request),
                        type(exc).__name__, exc)
            return problem_response(503, f"{what}_unavailable",
                                    f"The {name} is unavailable; try again later.",
                                    headers={"Retry-After": "5"})

        return handler

    on_storage = unavailable("storage", "object store")
    on_database = unavailable("database", "database")

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error on %s %s", request.method, _route(request), exc_info=exc)
        return problem_response(500, "internal_error")

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StorageError, on_storage)
    app.add_exception_handler(psycopg.OperationalError, on_database)
    app.add_exception_handler(psycopg_pool.PoolTimeout, on_database)
    app.add_exception_handler(Exception, on_unexpected)


def _route(request: Request) -> str:
    route = request.scope.get("route")
    return str(getattr(route, "path", "<unmatched>"))
