"""Request parsing with our errors, and the OpenAPI documentation of the same models.

``body(Model)`` and ``query(Model)`` both document the model for /v1/openapi.json (through
quart-schema) and validate with our error bodies: malformed JSON, an unknown field, a missing field
and an invalid value each get their own code and a message that names the field.

Every input that is not valid is the caller's error (400), never a 500 (issue 14): ``strict_loads``
is the one JSON reader of request bodies and frames — nesting deeper than ``MAX_JSON_DEPTH`` and
NaN/Infinity (which PostgreSQL's jsonb refuses) are malformed JSON; ``refuse_unstorable_request_text``
refuses NUL and lone surrogates in the query string and path of every request, ``form_problem`` in a
form. Dates and instants go through hub/instants.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar

from pydantic import ConfigDict, BaseModel, ValidationError
from quart import Request, request
from quart_schema import document_querystring, document_request, document_response

from hub.declared import Declared
from hub.errors import BadRequest
from storage.text import refusal

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


# Deeper than any document the API takes; deeper input exhausted Python's recursion (json, pydantic,
# the jsonb encoder) and each such request was a 500 and a traceback.
MAX_JSON_DEPTH = 64


class MalformedJSON(ValueError):
    """Not JSON this hub accepts: invalid, NaN/Infinity, too deep, or not UTF-8."""


def json_depth(value: Any) -> int:
    """How deep lists and dicts nest in a parsed value, level by level: no recursion, so any depth
    is safe to measure."""
    depth, level = 0, [value]
    while True:
        containers = [node for node in level if isinstance(node, (dict, list))]
        if not containers:
            return depth
        depth += 1
        level = []
        for node in containers:
            level.extend(node.values() if isinstance(node, dict) else node)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise MalformedJSON(f"the number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise MalformedJSON(f"{name} is not a JSON number")


def strict_loads(raw: bytes | str) -> Any:
    """JSON as RFC 8259 has it (no NaN or Infinity), nested at most MAX_JSON_DEPTH deep."""
    too_deep = MalformedJSON(f"the JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except MalformedJSON:
        raise
    except RecursionError:
        # the C decoder stops cleanly at Python's recursion limit (about 900 levels from here):
        # far deeper than MAX_JSON_DEPTH, so the answer is the same as for 65 levels
        raise too_deep from None
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError, an int over 4,300 digits
        raise MalformedJSON("the body is not valid JSON") from None
    if json_depth(data) > MAX_JSON_DEPTH:
        raise too_deep
    return data


def _reject_unstorable(value: Any, where: str, code: str = "invalid_field") -> None:
    """PostgreSQL text and jsonb cannot hold NUL or lone surrogates (JSON's "\\ud800"); refuse
    them here as the caller's error, not a 500 from storage."""
    if isinstance(value, str):
        problem = refusal(value)
        if problem is not None:
            raise BadRequest(f"{(where or 'value')[:100]}: {problem}", code=code)  # a name the caller chose
    elif isinstance(value, dict):
        for k, v in value.items():
            _reject_unstorable(k, where, code)
            _reject_unstorable(v, f"{where}.{k}" if where else str(k), code)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _reject_unstorable(v, f"{where}[{i}]", code)


def json_object(raw: bytes, what: str = "the body") -> dict:
    """``raw`` as a JSON object of storable text; BadRequest malformed_json / invalid_field."""
    try:
        data = strict_loads(raw)
    except MalformedJSON as exc:
        raise BadRequest(str(exc), code="malformed_json") from None
    if not isinstance(data, dict):
        raise BadRequest(f"{what} must be a JSON object", code="malformed_json")
    _reject_unstorable(data, "")
    return data


def refuse_unstorable_request_text(req: Request) -> None:
    """Every request: a query string or path parameter with NUL or a lone surrogate is 400 before
    any view reads it (views read request.args in many ways; this is the one place for all)."""
    if req.query_string:  # else req.args would parse nothing into a new MultiDict
        for key, value in req.args.items(multi=True):
            _reject_unstorable(key, "query", "invalid_query")
            _reject_unstorable(value, key, "invalid_query")
    for key, value in (req.view_args or {}).items():
        _reject_unstorable(value, key, "invalid_path")


def form_problem(form: Any) -> str | None:
    """Why a form (a MultiDict) cannot be taken as it is, or None: the caller answers 400 in its
    own error shape (the OAuth token endpoint answers RFC 6749 bodies)."""
    for key, value in form.items(multi=True):
        problem = refusal(key) or refusal(value)
        if problem is not None:
            return f"a form field {problem}"
    return None


async def parse_body(model: type[M]) -> M:
    raw = await request.get_data(as_text=False)
    if not raw:
        raise BadRequest("a JSON body is required", code="malformed_json")
    data = json_object(raw)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid(exc) from None


def parse_query(model: type[M]) -> M:
    args = request.args.to_dict()
    _reject_unstorable(args, "", "invalid_query")
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


@dataclass(frozen=True)
class Documented:
    """What a view's decorators say of it for /v1/openapi.json beyond quart-schema's models (hub/openapi.py)."""
    path_values: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a path parameter's values
    body_optional: bool = False


DOCUMENTED: Declared[Documented] = Declared(Documented())


def path_values(**values: tuple[str, ...]) -> Callable:
    """Document the values a path parameter takes (an enum in /v1/openapi.json, hub/openapi.py);
    the view still answers any other value itself, with its own error."""
    def decorator(func: Callable) -> Callable:
        return DOCUMENTED.declare(func, path_values={**DOCUMENTED.of(func).path_values, **values})

    return decorator


def optional_body(func: Callable) -> Callable:
    """The view accepts no body at all (an empty object's defaults): the document says not required."""
    return DOCUMENTED.declare(func, body_optional=True)


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
