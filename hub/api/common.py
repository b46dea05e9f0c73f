"""What every blueprint shares: the request's principal and organisation, ids, pages, JSON shapes."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from quart import current_app, g
from quart_schema import document_response

from device_client.shared.clock import rfc3339
from hub.auth.principals import OrgContext, Principal
from hub.errors import BadRequest

if TYPE_CHECKING:
    from hub.services import Services


def services() -> Services:
    """The process's services, for the request being served: the one accessor every view uses."""
    return current_app.config["SERVICES"]


def principal() -> Principal:
    return g.principal


def org() -> OrgContext:
    return g.org


def parse_uuid(value: str, what: str = "id") -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, TypeError):
        raise BadRequest(f"{what} is not a valid uuid", code="bad_uuid") from None


# The deepest page a list serves: beyond it the offset would overflow PostgreSQL's bigint (a fuzzer
# found page=2**61), and no caller pages that far.
MAX_PAGE = 1_000_000


# The spec's Limits table: list endpoints default to page 1, limit 10.
DEFAULT_PAGE, DEFAULT_LIMIT = 1, 10


class PageQuery(BaseModel):
    model_config = ConfigDict(extra="ignore")
    page: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE, description="starts at 1; default 1")
    limit: int = Field(DEFAULT_LIMIT, ge=1, le=500, description="default 10")

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.limit


class Pagination(BaseModel):
    page: int
    limit: int
    total: int
    totalPages: int


class ErrorBody(BaseModel):
    """The general error body (memory-test and tunnel endpoints have their own)."""
    error: str
    message: str
    details: Any | None = None


def errors(*statuses: int):
    """Document the error responses a view can give."""
    def decorator(func):
        for status in statuses:
            func = document_response(ErrorBody, status)(func)
        return func
    return decorator


def pagination(page: int, limit: int, total: int) -> dict[str, int]:
    return {"page": page, "limit": limit, "total": total, "totalPages": math.ceil(total / limit) if limit else 0}


# Values JSON takes as they are, by exact type: most of a row, so they skip the isinstance chain
# below (jsonable runs over every answer's whole body).
_AS_IS = frozenset({str, int, bool, float, type(None)})


def jsonable(value: Any) -> Any:
    kind = type(value)
    if kind in _AS_IS:
        return value
    if kind is dict:
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, dt.datetime):
        return rfc3339(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
