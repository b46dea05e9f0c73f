"""Small helpers of the conformance tests (the hub itself is tests/conformance/conftest.py)."""

from __future__ import annotations

import base64
import uuid

from typing import TYPE_CHECKING

import httpx
import trio

if TYPE_CHECKING:
    from tests.conformance.conftest import SpecHub


def error_code(r: httpx.Response, status: int, field: str = "error") -> str:
    """The answer is ``status`` with a JSON error body (never HTML); its code."""
    assert r.status_code == status, (r.request.method, str(r.request.url), r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json"), r.headers["content-type"]
    body = r.json()
    assert isinstance(body.get(field), str) and isinstance(body.get("message"), str), body
    return body[field]


def new_config(spec, name: str | None = None, body: dict | None = None) -> dict:
    r = spec.call("POST", "/v1/configurations", json={"name": name or f"c-{uuid.uuid4().hex[:8]}",
                                                      "spec": {"ports": [{"port": 8080}]}, **(body or {})})
    assert r.status_code == 201, r.text
    return r.json()["data"]


def new_fleet(spec, **body) -> dict:
    r = spec.call("POST", "/v1/fleets", json={"name": f"f-{uuid.uuid4().hex[:8]}", **body})
    assert r.status_code == 201, r.text
    return r.json()["data"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def wait_until(spec: SpecHub, predicate, timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` until true, sleeping on the hub's trio clock between tries; bounded."""
    for _ in range(int(timeout / interval)):
        if predicate():
            return
        spec.run(trio.sleep, interval)
    raise AssertionError(f"not true within {timeout} s")
