"""docs/device-protocol.md cannot drift from the code: its generated blocks are rendered again from the
models and compared, every verb a real agent answers and every event kind device code sends is in the
tables, and the JSON Schema document is a valid schema that the agent's real hello satisfies."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from device_client.shared import linkcodes, protocol, protocol_schema, verbs
from device_client.agent import Agent, AgentConfig
from device_client.memtest import MemtestConfig
from webrtc.device_tunnel import attach as tunnel_engine

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "device-protocol.md"


def test_the_documents_generated_blocks_are_what_the_code_says():
    text = DOC.read_text()
    names = set(re.findall(r"<!-- generated:([a-z-]+) -->", text))
    assert names == set(protocol_schema.tables()), "every generated block is in the document, once"
    assert protocol_schema.render(text) == text, (
        "docs/device-protocol.md is stale: run python -m device_client.shared.protocol_schema docs/device-protocol.md")


def test_a_changed_model_makes_the_document_stale(monkeypatch):
    # the check above can fail: a new reply member shows up in the rendered verb table
    monkeypatch.setattr(verbs.Pong, "model_json_schema",
                        classmethod(lambda cls, **kw: {"properties": {"pong": {"const": True}, "extra": {"type": "string"}},
                                                       "required": ["pong"]}))
    assert protocol_schema.render(DOC.read_text()) != DOC.read_text()


def test_every_verb_the_agent_answers_is_in_the_table_and_no_other(tmp_path):
    # with the tunnel engine its launchers pass in (webrtc/device_tunnel.py): the tunnel verbs too
    agent = Agent(AgentConfig("http://127.0.0.1:9", "t", tmp_path, memtest=MemtestConfig(),
                              tunnel_engine=tunnel_engine))
    assert set(agent.commands.verbs()) == set(verbs.VERBS)


def test_every_event_kind_device_code_sends_is_in_the_table():
    sent: set[str] = set()
    for path in [*(ROOT / "device_client").rglob("*.py"), ROOT / "webrtc" / "device_tunnel.py"]:
        sent |= set(re.findall(r'(?:send_event|_send)\(\s*"([a-z][a-z0-9_.]*)"', path.read_text()))
    sent |= {"heartbeat"}  # the agent's heartbeat loop encodes its event directly
    assert sent and sent <= set(verbs.EVENTS), sorted(sent - set(verbs.EVENTS))


def test_every_hello_field_and_close_code_is_described():
    assert set(protocol.Hello.model_fields) == set(protocol_schema.HELLO_NOTES)
    assert {r.code for r in linkcodes.CLOSE_RULES} == set(linkcodes.Close)


def _descriptions(node) -> list[str]:
    if isinstance(node, dict):
        return ([node["description"]] if isinstance(node.get("description"), str) else []) + [
            d for v in node.values() for d in _descriptions(v)]
    if isinstance(node, list):
        return [d for v in node for d in _descriptions(v)]
    return []


def test_field_meanings_say_what_the_field_means_not_where_the_code_is():
    # A device maker has the document and the served schema, not our source tree.
    texts = _descriptions(protocol_schema.document()) + list(protocol_schema.HELLO_NOTES.values())
    assert [t for t in texts if re.search(r"\w+\.py\b", t)] == []
    prose = DOC.read_text().split("## Transport and authentication", 1)[1]
    assert re.findall(r"\w+/\w+\.py", prose) == []
    # the fields a maker asked about have a meaning in the tables
    for model, fields in ((protocol.Welcome, ("deviceId", "heartbeatInterval", "hubKeys", "maxFrameBytes")),
                          (protocol.ReplyError, ("code", "message")), (verbs.Refusal, tuple(verbs.Refusal.model_fields)),
                          (verbs.Drain, ("reconnectAfter", "url")), (verbs.Draining, ("reconnectAfter",))):
        schema = model.model_json_schema()["properties"]
        assert all(schema[f].get("description") for f in fields), (model.__name__, fields)


def test_the_reply_error_table_stands_where_error_replies_are_described():
    text = DOC.read_text()
    sections = dict(re.findall(r"^## (.+?)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    assert "<!-- generated:reply-error -->" in sections["Commands and replies"]
    assert "ReplyError" not in sections["Hello"]
    assert "| `code` | str | yes | machine-readable" in sections["Commands and replies"]


def test_the_served_document_is_json_schema_and_the_agents_hello_satisfies_it(tmp_path):
    doc = protocol_schema.document()
    json.dumps(doc)  # serialisable as served
    schemas = [*doc["frames"].values(), *(v[k] for v in doc["verbs"].values() for k in ("payload", "reply")),
               *(e["payload"] for e in doc["events"].values())]
    for schema in schemas:
        jsonschema.Draft202012Validator.check_schema(schema)
    agent = Agent(AgentConfig("http://127.0.0.1:9", "t", tmp_path, memtest=MemtestConfig(),
                              tunnel_engine=tunnel_engine))
    hello = json.loads(agent.frames.encode_hello(agent._hello()))
    jsonschema.validate(hello, doc["frames"]["hello"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**hello, "protocol": "one"}, doc["frames"]["hello"])


def test_strict_results_name_the_field_at_fault():
    with pytest.raises(verbs.Malformed) as info:
        verbs.check_reply("config.apply", {"status": "applied", "versionId": "v"})
    assert str(info.value) == "reply to config.apply: configId: Field required"
    with pytest.raises(verbs.Malformed) as info:
        verbs.check_reply("files.put", {"results": [{"path": "/etc/x"}]})
    assert info.value.where == "results.0.status"
    assert verbs.check_reply("files.put", {"results": [{"path": "/etc/x", "status": "on_device", "new": 1}]})


@pytest.mark.parametrize("text, limit", [("word " * 40, 123), ("é" * 100, 123), ("short", 123)])
def test_close_reasons_fit_and_are_cut_at_a_word(text, limit):
    reason = linkcodes.bounded_reason(text, limit)
    assert len(reason.encode()) <= limit
    if reason != text:
        assert reason.endswith("…")
        kept = reason[:-1]
        assert text.startswith(kept) and (" " not in text or text[len(kept)] == " ")


def test_the_hellos_memory_test_members_are_typed_in_the_schema():
    """lastMemoryTest and memoryTestRunning are kept as objects by the Hello model (the hub checks them
    itself, so one bad member does not cost the frame), and typed in protocol.json all the same."""
    import jsonschema

    hello = protocol_schema.document()["frames"]["hello"]
    validator = jsonschema.Draft202012Validator(hello)
    base = {"type": "hello", "protocol": 1, "agentVersion": "x", "bootReason": "power_on"}
    assert validator.is_valid({**base, "lastMemoryTest": None, "memoryTestRunning": None})
    assert not validator.is_valid({**base, "lastMemoryTest": {"runId": "r", "outcome": "no such outcome"}})
    assert not validator.is_valid({**base, "memoryTestRunning": {"runId": "r", "phase": "testing",
                                                                 "testedBytes": -5}})
    assert hello["properties"]["lastMemoryTest"]["anyOf"][0] == {"$ref": "#/$defs/MemtestResult"}
