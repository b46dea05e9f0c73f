"""/v1/openapi.json as tools read it (issue 15 §3): an independent OpenAPI 3.1 validator accepts it,
it says what the spec says (schemes, organisation header, queries, bodies, path names, extensions,
the memory-test members and enumerations, the rate headers), a client generated from it by
openapi-python-client — in this test, no hand edits — drives a short tour against a real hub with a
real agent, and that agent's real memory-test answers validate against the document's schemas.
"""

from __future__ import annotations

import base64
import importlib
import json
import sys
from pathlib import Path

import pytest
import trio

from device_client.memtest import MemtestConfig
from tests.conformance.spec import (
    ENDPOINTS,
    FEATURE_PATH_ENUM,
    MEMTEST_ERROR_FIELDS,
    MEMTEST_ERRORS_KEPT,
    MEMTEST_OUTCOMES,
    MEMTEST_PHASES,
    MEMTEST_RESULT_MEMBERS,
    MEMTEST_RUN_MEMBERS,
    MEMTEST_STATUS_MEMBERS,
    MEMTEST_VERDICTS,
    RATE_HEADERS,
    RETRY_AFTER,
    SCHEMES,
)
from tests.hubtools import start_agent, start_hub, threads_calling

ORG = "X-Organization-ID"


@pytest.fixture
async def hub(nursery, db_url, tmp_path):
    return await start_hub(nursery, db_url, tmp_path / "hub")


async def _document(hub) -> dict:
    r = await hub.client.get(hub.base_url + "/v1/openapi.json")
    assert r.status_code == 200, r.text
    return r.json()


def _operations(doc: dict):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield method, path, op


async def test_an_independent_validator_accepts_the_document(hub):
    from openapi_spec_validator import validate

    with trio.fail_after(30):
        doc = await _document(hub)
        assert doc["openapi"].startswith("3.1")
        validate(doc)  # raises with the first problem it finds


async def test_the_document_is_built_once_off_the_loop_and_a_client_holding_it_gets_a_304(hub, monkeypatch):
    """quart-schema built the document on every request, on the event loop (0.6 s of CPU on the bench
    machine): a public path that held the whole process. Built once now, in a worker thread, and the
    same bytes after; what it holds is what quart-schema builds."""
    document = hub.services.http_views["openapi"].document
    schema = document.build
    built = threads_calling(monkeypatch, document, "build")
    with trio.fail_after(60):
        url = hub.base_url + "/v1/openapi.json"
        async with trio.open_nursery() as nursery:  # requests meanwhile wait for the one build
            for _ in range(3):
                nursery.start_soon(hub.client.get, url)
        first = await hub.client.get(url)
        again = await hub.client.get(url)
        assert first.status_code == again.status_code == 200
        assert first.content == again.content and first.headers["content-type"] == "application/json"
        assert json.loads(first.content) == json.loads(json.dumps(schema()))
        etag = first.headers["etag"]
        assert etag == again.headers["etag"] and etag.startswith('"')
        unchanged = await hub.client.get(url, headers={"If-None-Match": etag})
        assert (unchanged.status_code, unchanged.content, unchanged.headers["etag"]) == (304, b"", etag)
        stale = await hub.client.get(url, headers={"If-None-Match": '"something-else"'})
        assert stale.status_code == 200 and stale.content == first.content
    assert built == [False], built  # once, and not on the loop's thread


async def test_the_document_says_what_the_spec_says(hub):
    with trio.fail_after(30):
        doc = await _document(hub)
        schemes = doc["components"]["securitySchemes"]
        assert set(SCHEMES) <= set(schemes)
        assert schemes["SessionCookie"] == {"type": "apiKey", "in": "cookie", "name": "fleethub_session"}
        ops = {(m, p): op for m, p, op in _operations(doc)}
        for (method, path), (section, auth, org) in ENDPOINTS.items():
            op = ops.get((method, path))
            assert op is not None, f"{method.upper()} {path} (spec: {section}) is not in the document"
            security = [sorted(s) for s in op["security"]]
            expected = {"Either": [["ApiSecretAuth", "ApiTokenAuth"], ["BearerAuth"], ["SessionCookie"]],
                        "Bearer": [["BearerAuth"], ["TunnelToken"]], "session": [["SessionCookie"]],
                        "tunnel": [["TunnelToken"]], "public": []}[auth]
            assert security == expected, (method, path, security)
            headers = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "header"}
            if org:
                assert headers.get(ORG, {}).get("required") is True, (method, path)
            else:  # not marked Org: never a required header (optional where the object names its own)
                assert headers.get(ORG, {}).get("required") is not True, (method, path)
            assert op["tags"] != ["extensions"], (method, path)
        # everything else is an extension, tagged and described
        extensions = [(m, p, op) for m, p, op in _operations(doc) if (m, p) not in ENDPOINTS]
        assert extensions
        for method, path, op in extensions:
            assert op["tags"] == ["extensions"] and op["x-fleethub-extension"] is True, (method, path)
            assert op.get("description") or op.get("summary"), f"{method.upper()} {path} is not described"

        # every query parameter declared, with the spec's defaults
        def query(method, path):
            return {p["name"]: p["schema"] for p in ops[(method, path)].get("parameters", []) if p["in"] == "query"}

        for path in ("/v1/configurations", "/v1/configurations/summary"):
            q = query("get", path)
            assert {"page", "limit", "search", "status", "sortBy", "sortOrder"} <= set(q), (path, q)
            assert q["page"]["default"] == 1 and q["limit"]["default"] == 10
        for path in ("/v1/devices", "/v1/fleets", "/v1/rollouts"):
            q = query("get", path)
            assert q["page"]["default"] == 1 and q["limit"]["default"] == 10, (path, q)
        # the device list's configuration filter, named as its other filters are, with its values
        statuses = query("get", "/v1/devices")["config_status"]
        assert {"rejected", "applied", "pending", "none"} <= set(json.dumps(statuses).replace('"', " ").split())
        # a device's configuration says why it was rejected, in the device's words
        configuration = doc["components"]["schemas"]["DeviceConfiguration"]["properties"]
        assert {"check_output", "workload_log", "version", "applied_version"} <= set(configuration)
        assert "2,048" in configuration["check_output"]["description"]
        assert query("get", "/v1/audit-events")["limit"]["default"] == 50
        assert query("get", "/v1/billing/tunnel/usage/records")["limit"]["default"] == 50
        assert query("get", "/v1/devices/{id}/memory-test/results")["limit"]["default"] == 20

        # every request body declared
        for (method, path), op in ops.items():
            if method in ("post", "put", "patch") and (method, path) in ENDPOINTS and "tunnel" not in path:
                if path.endswith(("/reboot", "/pause")):
                    continue  # the spec gives these no body
                assert "requestBody" in op, (method, path)
        rollout = ops[("post", "/v1/rollouts")]["requestBody"]["content"]["application/json"]["schema"]
        text = json.dumps(doc["components"]["schemas"].get(rollout.get("$ref", "#/x").rsplit("/", 1)[1], rollout))
        assert "anyOf" in text and "ForcedRollout" in text and "BatchedRollout" in text
        feature = ops[("put", "/v1/billing/features/{feature}")]
        assert feature["requestBody"]["required"] is True
        [path_param] = [p for p in feature["parameters"] if p["in"] == "path"]
        assert path_param["schema"]["enum"] == list(FEATURE_PATH_ENUM)
        # the spec's path parameter names
        for method, path, op in _operations(doc):
            if path.startswith(("/v1/configurations/{", "/v1/devices/{deviceId}")) and "/versions" not in path:
                names = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
                assert names <= {"configId", "fileId", "deviceId"}, (method, path, names)
        assert not any("{fleet_id}/update-window" in p for p in doc["paths"])
        # the rollout step as the spec spells it
        step = doc["components"]["schemas"]["RolloutDeviceOut"]["properties"]["step"]
        assert "QUEUED_MAINTENANCE" in step["enum"]


def _component(doc: dict, schema: dict) -> dict:
    """The component a schema refers to (itself when inline); ``anyOf [X, null]`` reads as X."""
    if "anyOf" in schema:
        [schema] = [s for s in schema["anyOf"] if s.get("type") != "null"]
    if "$ref" in schema:
        return doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _response(doc: dict, method: str, path: str, status: str = "200") -> dict:
    schema = doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
    return _component(doc, _component(doc, schema)["properties"]["data"])


def _enum(doc: dict, schema: dict) -> list[str]:
    return _component(doc, schema)["enum"]


async def test_memory_test_answers_are_typed(hub):
    """Issue 31 item 15: status, health, history and results were ``additionalProperties: true``
    objects; they are the spec's members with its enumerations."""
    with trio.fail_after(30):
        doc = await _document(hub)
        status = _response(doc, "get", "/v1/devices/{id}/memory-test")
        assert set(MEMTEST_STATUS_MEMBERS) <= set(status["properties"])
        run = _component(doc, status["properties"]["status"])
        assert set(MEMTEST_RUN_MEMBERS) <= set(run["properties"])
        assert _enum(doc, run["properties"]["phase"]) == list(MEMTEST_PHASES)
        health = _component(doc, status["properties"]["health"])
        assert {"capabilities", "hardwareCorruptedBytes", "edac", "retiredPages", "fault", "faultReason",
                "kernelErrors", "lastResult"} <= set(health["properties"])
        assert set(_component(doc, health["properties"]["capabilities"])["properties"]) >= {
            "online", "offline", "offlineReason"}
        last = _component(doc, health["properties"]["lastResult"])
        [result] = {json.dumps(_component(doc, status["properties"]["history"]["items"])),
                    json.dumps(_component(doc, _response(doc, "get", "/v1/devices/{id}/memory-test/results")
                                          ["properties"]["results"]["items"])), json.dumps(last)}
        result = json.loads(result)  # one result model for history, results and the last result
        assert set(MEMTEST_RESULT_MEMBERS) <= set(result["properties"])
        assert {"outcome", "verdict", "runId", "source"} <= set(result["required"])
        assert _enum(doc, result["properties"]["outcome"]) == list(MEMTEST_OUTCOMES)
        assert _enum(doc, result["properties"]["verdict"]) == list(MEMTEST_VERDICTS)
        assert _enum(doc, result["properties"]["source"]) == ["live", "stored"]
        # present only on an interrupted run: never null
        assert '"type": "null"' not in json.dumps(result["properties"]["interrupted"])
        assert set(_component(doc, result["properties"]["interrupted"])["properties"]) >= {"phase", "pass", "pattern"}
        errors = _component(doc, result["properties"]["errors"])
        assert errors["maxItems"] == MEMTEST_ERRORS_KEPT
        assert set(_component(doc, errors["items"])["properties"]) == set(MEMTEST_ERROR_FIELDS)
        # a start's and a cancel's answer, and the 409 busy body, carry the same run status
        for path in ("/v1/devices/{id}/memory-test", "/v1/devices/{id}/memory-test/cancel"):
            started = _response(doc, "post", path, "202")
            assert _component(doc, started["properties"]["status"]) == run
        busy = doc["paths"]["/v1/devices/{id}/memory-test"]["post"]["responses"]["409"]
        assert _component(doc, _component(doc, busy["content"]["application/json"]["schema"])
                          ["properties"]["status"]) == run


async def test_rate_headers_are_declared_on_every_api_answer(hub):
    """Issue 31 item 16: the X-RateLimit-* headers (every /v1 answer) and Retry-After (a 429) were
    prose in the 429 description only."""
    with trio.fail_after(30):
        doc = await _document(hub)
        declared = doc["components"]["headers"]
        assert set(RATE_HEADERS) | {RETRY_AFTER} <= set(declared)
        for name in (*RATE_HEADERS, RETRY_AFTER):
            assert declared[name]["schema"]["type"] == "integer" and declared[name]["description"]
        seen_429 = 0
        for method, path, op in _operations(doc):
            if not path.startswith("/v1/"):
                continue
            for status, answer in op["responses"].items():
                refs = {name: h.get("$ref") for name, h in answer.get("headers", {}).items()}
                expected = list(RATE_HEADERS) + ([RETRY_AFTER] if str(status) == "429" else [])
                for name in expected:
                    assert refs.get(name) == f"#/components/headers/{name}", (method, path, status, name)
                seen_429 += str(status) == "429"
        assert seen_429 > 50  # every operation that can be refused for its rate


def _validate(doc: dict, component: str, body: dict) -> None:
    """``body`` against the document's ``component`` (OpenAPI 3.1 schemas are JSON Schema 2020-12)."""
    import jsonschema

    schema = {"$ref": f"#/components/schemas/{component}", "components": doc["components"]}
    jsonschema.Draft202012Validator(schema).validate(body)


def _generate(doc: dict, where: Path) -> None:
    """openapi-python-client, as a user would run it (its own process), into ``where``."""
    import subprocess

    exe = Path(sys.executable).parent / "openapi-python-client"
    assert exe.exists(), "openapi-python-client is in the test extra of pyproject.toml"
    spec = where / "openapi.json"
    spec.write_text(json.dumps(doc))
    out = subprocess.run([str(exe), "generate", "--path", str(spec), "--output-path", str(where / "fleethub_client"),
                          "--meta", "none"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    # the generator says what it had to leave out; nothing may be
    assert "WARNING" not in out.stdout and "Unable to" not in out.stdout, out.stdout[-6000:]


async def test_a_generated_client_drives_a_tour(hub, nursery, tmp_path):
    with trio.fail_after(150):
        _, token = await hub.provision("tour-device")
        await start_agent(nursery, hub.base_url, token, tmp_path / "agent",
                          memtest=MemtestConfig(budget=256 << 10, chunk_words=1 << 13))
        await trio.to_thread.run_sync(_generate, await _document(hub), tmp_path)
        sys.path.insert(0, str(tmp_path))
        try:
            device_id, run_id = await _tour(hub)
        finally:
            sys.path.remove(str(tmp_path))
            for name in [n for n in sys.modules if n == "fleethub_client" or n.startswith("fleethub_client.")]:
                del sys.modules[name]
        # Real answers against the document's schemas (issue 31 item 15): a busy start, the status
        # while running and once done, and the stored results
        doc = await _document(hub)
        path = f"/v1/devices/{device_id}/memory-test"
        busy = await hub.call("POST", path, json={"quick": True})
        if busy.status_code == 409:  # still running (a quick run on a small memory can be done already)
            _validate(doc, "MemoryTestError", busy.json())
        for _ in range(600):
            r = await hub.call("GET", path + "/results")
            assert r.status_code == 200, r.text
            if any(x["runId"] == run_id for x in r.json()["data"]["results"]):
                break
            await trio.sleep(0.1)
        _validate(doc, "ResultsEnvelope", r.json())
        assert all(name in r.headers for name in RATE_HEADERS)  # as declared on every /v1 answer
        [result] = r.json()["data"]["results"]
        assert result["outcome"] in MEMTEST_OUTCOMES and result["source"] == "stored"
        r = await hub.call("GET", path)
        assert r.status_code == 200 and r.json()["data"]["history"], r.text
        _validate(doc, "TestStatusEnvelope", r.json())
        never_linked, _ = await hub.provision("tour-offline")  # the stored answer, with nothing stored
        r = await hub.call("GET", f"/v1/devices/{never_linked}/memory-test")
        assert r.status_code == 200 and r.json()["data"]["source"] == "stored", r.text
        _validate(doc, "TestStatusEnvelope", r.json())
        # and what the document refuses, so the check above can fail
        import jsonschema

        for broken in ({**result, "outcome": "passed"}, {**result, "interrupted": None},
                       {**result, "errors": [{"physAddr": 1}] * (MEMTEST_ERRORS_KEPT + 1)}):
            with pytest.raises(jsonschema.ValidationError):
                _validate(doc, "ResultsEnvelope", {"data": {"results": [broken]}})


async def _tour(hub) -> None:
    client_mod = importlib.import_module("fleethub_client")
    api = "fleethub_client.api."
    create_config = importlib.import_module(api + "configurations.post_create_configuration")
    upload = importlib.import_module(api + "secret_files.post_upload_config_file")
    list_devices = importlib.import_module(api + "devices_fleets_and_configuration_versions.get_list_devices")
    start = importlib.import_module(api + "memory_test.post_start_memory_test")
    status = importlib.import_module(api + "memory_test.get_memory_test_status")
    models = importlib.import_module("fleethub_client.models")

    # ApiTokenAuth + ApiSecretAuth, the two-header form the spec declares
    client = client_mod.AuthenticatedClient(base_url=hub.base_url, token=hub.pat[1], prefix="",
                                            auth_header_name="X-API-Secret-Key",
                                            headers={"X-API-Token-ID": hub.pat[0]}, raise_on_unexpected_status=True)
    org = hub.org_id
    async with client as c:
        r = await create_config.asyncio_detailed(client=c, x_organization_id=org, body=models.ConfigCreate(
            name="tour", spec=models.ConfigCreateSpec.from_dict({"ports": [{"port": 8080}]})))
        assert r.status_code == 201, r.content
        config = r.parsed.data
        assert config.name == "tour" and config.version.version == 1

        r = await upload.asyncio_detailed(config.id, client=c, x_organization_id=org, body=models.Upload(
            path="/etc/tour/token", content_base64=base64.b64encode(b"tour-secret").decode()))
        assert r.status_code == 201, r.content
        assert r.parsed.data.path == "/etc/tour/token" and b"tour-secret" not in r.content

        r = await list_devices.asyncio_detailed(client=c, x_organization_id=org)
        assert r.status_code == 200, r.content
        [device] = [d for d in r.parsed.data if d.name == "tour-device"]
        assert r.parsed.pagination.limit == 10

        r = await start.asyncio_detailed(device.id, client=c, x_organization_id=org,
                                         body=models.StartRequest(quick=True))
        assert r.status_code == 202, r.content
        run_id = r.parsed.data.run_id
        assert run_id and r.parsed.data.device_id == str(device.id)

        r = await status.asyncio_detailed(device.id, client=c, x_organization_id=org)
        assert r.status_code == 200, r.content
        assert r.parsed.data.source.value == "live"
        assert r.parsed.data.status.run_id == run_id
        assert r.parsed.data.status.phase.value in MEMTEST_PHASES
        return device.id, run_id
