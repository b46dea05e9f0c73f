"""How a view's answer becomes a JSON body: the hub's two changes to what Quart and quart_schema do.

``set_up(app)`` after ``QuartSchema(app)``:

- Plain dicts and lists go straight to Quart. quart_schema converts every view's answer for JSON,
  and for a dict or a list that meant a new pydantic TypeAdapter and a deep copy per response: 4 %
  of the hub's CPU on ``GET /v1/devices/{id}`` (py-spy, bench/http_ratio.py). Our views answer plain
  JSON-ready dicts and lists; anything else (a model) is still converted, and a model inside a dict
  is still encoded by the provider's ``default``.
- The body is encoded with orjson instead of the standard library's ``json``: a device document
  (595 bytes) in 4 µs instead of 30 (bench/http_ratio.py's profile; tests/api/test_answers.py holds
  the two to the same document). The output is the same JSON as before: keys sorted, compact, one
  newline at the end, and every type orjson would write its own way (datetimes, dataclasses) goes
  through the provider's ``default`` as it did. Two differences, both still valid JSON and decoded
  to the same values: text outside ASCII is written as UTF-8 rather than as ``\\u`` escapes, and a
  float NaN or infinity (which no answer of ours carries) is ``null`` where ``json`` wrote the
  invalid ``NaN``. What orjson refuses (an integer past 64 bits, a key that is not text, text that
  is not valid Unicode) is encoded by the standard library as before, so nothing that encoded
  before fails now.

Request bodies are still read by the standard library: the hub's validation of stored text
(hub/api/validation.py) sees the lone surrogates ``json`` decodes and orjson would refuse with a
different error.
"""

from __future__ import annotations

from typing import Any

import orjson
from quart_trio import QuartTrio

_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATETIME
            | orjson.OPT_PASSTHROUGH_DATACLASS)


def set_up(app: QuartTrio) -> None:
    _plain_data_as_is(app)
    _encode_with_orjson(app)


def _plain_data_as_is(app: QuartTrio) -> None:
    converted = app.make_response  # quart_schema's wrapper (functools.wraps keeps the original)
    plain = converted.__wrapped__

    async def make_response(result):  # noqa: ANN001, ANN202 — Quart's own signature
        value = result[0] if isinstance(result, tuple) else result
        return await (plain if type(value) in (dict, list) else converted)(result)

    app.make_response = make_response


def _encode_with_orjson(app: QuartTrio) -> None:
    provider = app.json  # quart_schema's (its ``default`` knows pydantic models)
    compact_json = provider.response

    def response(*args: Any, **kwargs: Any) -> Any:
        if provider.compact is False or (provider.compact is None and app.debug):
            return compact_json(*args, **kwargs)  # indented: the debugging form, left to json
        obj = provider._prepare_response_obj(args, kwargs)
        try:
            body = orjson.dumps(obj, default=provider.default, option=_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError is one: what only json can write
            return compact_json(*args, **kwargs)
        return app.response_class(body, mimetype=provider.mimetype)

    provider.response = response
