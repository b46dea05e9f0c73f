"""Request parsing with our errors, and the OpenAPI documentation of the same models.

``body(Model)`` and ``query(Model)`` both document the model for /v1/openapi.json (through
quart-schema) and validate with our error bodies: malformed JSON, an unknown field, a missing field
and an invalid value each get their own code and a message that names the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from pydantic import ConfigDict, BaseModel, ValidationError
from quart import request
from quart_schema import document_querystring, document_request, document_response

from hub.errors import BadRequest

M = TypeVar("M", bound=BaseModel)

_CODES = {"extra_forbidden": "unknown_field", "missing": "missing_field"}


def invalid(exc: ValidationError, *, where: str = "body") -> BadRequest:
    problems = [{"field": ".".join(str(p) for p in e["loc"]) or where, "problem": e["msg"], "type": e["type"]}
                for e in exc.errors(include_url=False, include_input=False)]
    first = problems[0]
    code = _CODES.get(first["type"], "invalid_field")
    text = "unknown field" if code == "unknown_field" else first["problem"]
    return BadRequest(f"{first['field']}: {text}", code=code,
                      details=[{"field": p["field"], "problem": p["problem"]} for p in problems])


def _reject_nul(value: Any, where: str) -> None:
    """PostgreSQL text and jsonb cannot hold NUL; refuse it here as the caller's error, not a 500."""
    if isinstance(value, str):
        if "\x00" in value:
            raise BadRequest(f"{where}: NUL characters are not allowed", code="invalid_field")
    elif isinstance(value, dict):
        for k, v in value.items():
            _reject_nul(k, where)
            _reject_nul(v, f"{where}.{k}" if where else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _reject_nul(v, f"{where}[{i}]")


async def parse_body(model: type[M]) -> M:
    raw = await request.get_data(as_text=False)
    if not raw:
        raise BadRequest("a JSON body is required", code="malformed_json")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not valid JSON", code="malformed_json") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", code="malformed_json")
    _reject_nul(data, "")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None


def parse_query(model: type[M]) -> M:
    args = request.args.to_dict()
    _reject_nul(args, "")
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        raise invalid(exc, where="query") from None


def body(model: type[M]) -> Callable:
    def decorator(func: Callable) -> Callable:
        @wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await func(*args, data=await parse_body(model), **kwargs)

        return document_request(model)(wrapper)

    return decorator


def query(model: type[M]) -> Callable:
    def decorator(func: Callable) -> Callable:
        @wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await func(*args, query_args=parse_query(model), **kwargs)

        return document_querystring(model)(wrapper)

    return decorator


def path_values(**values: tuple[str, ...]) -> Callable:
    """Document the values a path parameter takes (an enum in /v1/openapi.json, hub/openapi.py);
    the view still answers any other value itself, with its own error."""
    def decorator(func: Callable) -> Callable:
        func._fleethub_path_values = {**getattr(func, "_fleethub_path_values", {}), **values}
        return func

    return decorator


def optional_body(func: Callable) -> Callable:
    """The view accepts no body at all (an empty object's defaults): the document says not required."""
    func._fleethub_body_optional = True
    return func


def responds(model: type[BaseModel] | None, status: int = 200) -> Callable:
    return document_response(model, status) if model is not None else (lambda f: f)


_ENVELOPES: dict[tuple, type[BaseModel]] = {}


class DeletedOut(BaseModel):
    """What a DELETE answers: the id and ``deleted: true`` (some add counts or the path)."""
    model_config = ConfigDict(extra="allow")
    id: str
    deleted: bool


def enveloped(model: type[BaseModel], *, many: bool = False, paged: bool = False) -> type[BaseModel]:
    """``{"data": model}`` (``many``: a list of them; ``paged``: with the pagination member) as a
    documented response model, built once per shape."""
    from pydantic import create_model

    from hub.api.common import Pagination

    key = (model, many, paged)
    if key not in _ENVELOPES:
        fields: dict[str, Any] = {"data": (list[model] if many else model, ...)}
        if paged:
            fields["pagination"] = (Pagination, ...)
        name = f"{model.__name__}{'List' if many else ''}{'Page' if paged else ''}Envelope"
        _ENVELOPES[key] = create_model(name, **fields)
    return _ENVELOPES[key]
