"""hub/answers.py: an answer's JSON body encoded with orjson says what the standard library's json
said, value for value, and byte for byte where the text is ASCII; what orjson refuses is still
encoded (by json, as before) instead of failing the request."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from enum import Enum

import pytest
from pydantic import BaseModel
from quart_schema import QuartSchema
from quart_trio import QuartTrio

from hub import answers


def _app(set_up: bool) -> QuartTrio:
    app = QuartTrio("answers-test")
    QuartSchema(app)
    if set_up:
        answers.set_up(app)
    return app


class Colour(str, Enum):
    RED = "red"


class Item(BaseModel):
    name: str
    at: dt.datetime


WHEN = dt.datetime(2026, 11, 26, 17, 30, 1, 123456, tzinfo=dt.timezone.utc)

CASES = {
    "document": {"data": {"id": str(uuid.uuid4()), "tags": ["a", "b"], "online": True, "n": 3, "x": 1.5,
                          "none": None, "nested": {"z": 1, "a": [1, {"k": "v"}]}}},
    "list": [1, "two", None, False],
    "uuid": {"id": uuid.UUID("12345678-1234-5678-1234-567812345678")},
    "datetime": {"at": WHEN, "day": WHEN.date()},
    "enum": {"colour": Colour.RED},
    "model inside": {"data": Item(name="n", at=WHEN)},
    "integer past 64 bits": {"n": 2 ** 70},
    "keys that are not text": {1: "a", 2: "b"},
    "a lone surrogate": {"s": "bad \ud800 text"},
}


@pytest.mark.parametrize("name", list(CASES))
async def test_the_body_is_what_json_wrote(name):
    value = CASES[name]
    before = await _app(False).json.response(value).get_data()
    after = await _app(True).json.response(value).get_data()
    assert after == before, (name, before, after)
    assert after.endswith(b"\n")


async def test_text_outside_ascii_is_utf8_and_decodes_to_the_same_value():
    value = {"name": "kiosk Zürich ☕", "emoji": "🚜"}
    before = await _app(False).json.response(value).get_data()
    after = await _app(True).json.response(value).get_data()
    assert b"\\u" in before and "Zürich".encode() in after  # json escaped it; orjson writes UTF-8
    assert json.loads(after) == json.loads(before) == value


async def test_a_status_and_headers_pass_through_jsonify():
    app = _app(True)
    async with app.app_context():
        from quart import jsonify

        response = jsonify({"error": "x"})
        assert response.mimetype == "application/json"
        assert await response.get_data() == b'{"error":"x"}\n'


async def test_debug_keeps_the_indented_form():
    app = _app(True)
    app.debug = True
    body = await app.json.response({"b": 1, "a": 2}).get_data()
    assert body == b'{\n  "a": 2,\n  "b": 1\n}\n'
