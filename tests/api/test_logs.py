"""Structured logs: one JSON object per line, with the request id and organisation of the request."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import uuid

from quart import g
from quart_trio import QuartTrio

from hub.auth.principals import OrgContext
from hub.logs import JsonFormatter, RequestContext
from tests.e2e.clitools import clean_env, fleethub_exe


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
    result = subprocess.run([fleethub_exe(), "--log-format", "json", "admin", "--data-dir", str(tmp_path / "hub"),
                             "create-org", "Logs Org"], capture_output=True, text=True, timeout=120,
                            env=clean_env(), stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "no log lines"
    entries = [json.loads(line) for line in lines]  # every line is JSON
    assert any("migrations" in e["message"] for e in entries), entries
