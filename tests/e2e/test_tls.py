"""``fleethub serve --certfile --keyfile``: HTTPS over HTTP/1.1 and HTTP/2, and HTTP/3 over QUIC."""

from __future__ import annotations

import json
import ssl

import httpx

from tests.e2e.certs import self_signed
from tests.e2e.clitools import free_port, run_cli_json, wait_until
from tests.e2e.h3client import h3_get


def test_https_http2_and_http3(tmp_path, procs):
    certfile, keyfile = self_signed(tmp_path)
    data = tmp_path / "hub"
    port, quic_port = free_port(), free_port()  # TCP, UDP (tests/ports.py: free over both)
    serve = procs("serve", ["serve", "--port", str(port), "--data-dir", str(data), "--certfile", str(certfile),
                            "--keyfile", str(keyfile), "--quic-port", str(quic_port)])
    base = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=str(certfile))
    wait_until(lambda: httpx.get(base + "/readyz", verify=trust, timeout=2).status_code == 200,
               timeout=40, what="the TLS hub to be ready", proc=serve)
    # admin needs the data dir the hub created (a typo'd one gets nothing)
    org = run_cli_json(["admin", "--data-dir", str(data), "create-org", "TLS Org"])
    run_cli_json(["admin", "--data-dir", str(data), "create-user", "ops@tls.test", "--org", org["id"],
                  "--role", "admin"])
    pat = run_cli_json(["admin", "--data-dir", str(data), "create-pat", "ops@tls.test"])
    headers = {"X-API-Token-ID": pat["id"], "X-API-Secret-Key": pat["secret"], "X-Organization-ID": org["id"]}

    # plain HTTP on the TLS port is not served
    try:
        plain = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code
    except httpx.HTTPError:
        plain = None
    assert plain != 200

    with httpx.Client(verify=trust, http2=False) as c:
        r = c.get(base + "/v1/me", headers=headers)
        assert r.status_code == 200 and r.http_version == "HTTP/1.1", (r.status_code, r.http_version)
        # hypercorn tells TCP clients where HTTP/3 is
        assert f":{quic_port}" in r.headers.get("alt-svc", ""), r.headers
    with httpx.Client(verify=trust, http2=True) as c:
        r = c.get(base + "/v1/me", headers=headers)
        assert r.status_code == 200 and r.http_version == "HTTP/2", (r.status_code, r.http_version)
        me = r.json()["data"]

    response = h3_get("127.0.0.1", quic_port, "/v1/me", cafile=str(certfile), headers=headers)
    assert response["status"] == 200, response
    assert json.loads(response["body"])["data"] == me
    unauthenticated = h3_get("127.0.0.1", quic_port, "/v1/me", cafile=str(certfile))
    assert unauthenticated["status"] == 401
    assert json.loads(unauthenticated["body"])["error"] == "unauthenticated"

    # a real agent links over wss to the hub's own TLS, trusting the certificate through SSL_CERT_FILE
    # alone (docs/production.md, "Devices and the hub's certificate")
    with httpx.Client(base_url=base, verify=trust, headers=headers, timeout=10) as c:
        r = c.post("/v1/devices", json={"name": "tls-device"})
        assert r.status_code == 201, r.text
        device_id = r.json()["data"]["id"]
        token_file = tmp_path / "token"
        token_file.write_text(r.json()["data"]["token"])
        agent = procs("agent", ["agent", "--hub", base, "--token-file", str(token_file), "--data-dir",
                                str(tmp_path / "agent")], env={"SSL_CERT_FILE": str(certfile)})
        wait_until(lambda: c.get(f"/v1/devices/{device_id}").json()["data"]["online"], timeout=30,
                   what="the agent online over wss", proc=agent)
        assert c.post(f"/v1/devices/{device_id}/ping").status_code == 200
