"""Structured logs: one JSON object per line, with the request id and organisation of the request."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import uuid

import httpx

from quart import g
from quart_trio import QuartTrio

from hub.auth.principals import OrgContext
from hub.logs import JsonFormatter, RequestContext
from tests.e2e.clitools import clean_env, fleethub_exe, wait_until
from tests.ports import free_port


def _capture() -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestContext())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"fleethub.test.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger, stream


async def test_records_inside_a_request_carry_its_id_and_organisation():
    app = QuartTrio("logs")
    logger, stream = _capture()
    org_id = uuid.uuid4()
    async with app.test_request_context("/v1/devices"):
        g.request_id = "req-123"
        g.org = OrgContext(org_id, "admin")
        logger.warning("device %s did not answer", "d-1")
    logger.info("outside any request")
    first, second = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert first["message"] == "device d-1 did not answer" and first["level"] == "WARNING"
    assert first["request_id"] == "req-123" and first["org_id"] == str(org_id)
    assert first["time"].endswith("+00:00")
    assert "request_id" not in second and second["message"] == "outside any request"


def test_exceptions_are_one_json_line(tmp_path):
    logger, stream = _capture()
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["message"] == "failed" and "ValueError: boom" in entry["exception"]


def test_the_cli_writes_json_logs(tmp_path):
    """``fleethub --log-format json serve``: every line it writes is a JSON object, from the embedded
    PostgreSQL's start and the migrations to the stop (``admin`` needs a data dir serve made)."""
    port = free_port()
    serve = subprocess.Popen([fleethub_exe(), "--log-format", "json", "serve", "--data-dir", str(tmp_path / "hub"),
                              "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=clean_env(), stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: _ready(port), timeout=60, what="serve ready")
    finally:
        serve.send_signal(signal.SIGINT)
        _, stderr = serve.communicate(timeout=60)
    assert serve.returncode == 0, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.strip() and not line.strip().startswith("SIGINT")]
    assert lines, "no log lines"
    entries = [json.loads(line) for line in lines]  # every line is JSON
    assert any("migrations" in e["message"] for e in entries), entries


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
