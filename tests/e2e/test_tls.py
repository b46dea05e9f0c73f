"""``fleethub serve --certfile --keyfile``: HTTPS over HTTP/1.1 and HTTP/2, and HTTP/3 over QUIC."""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import threading

import httpx

from tests.e2e.certs import self_signed
from tests.e2e.clitools import clean_env, fleethub_exe, free_port, run_cli_json, wait_until
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
    # alone (docs/production.md, "Devices and the hub's certificate"); it offers an echo port to tunnels
    echo_port = _echo_server()
    ice = {"FLEETHUB_ICE_ADDRESSES": "127.0.0.1"}
    with httpx.Client(base_url=base, verify=trust, headers=headers, timeout=10) as c:
        r = c.post("/v1/devices", json={"name": "tls-device"})
        assert r.status_code == 201, r.text
        device_id = r.json()["data"]["id"]
        token_file = tmp_path / "token"
        token_file.write_text(r.json()["data"]["token"])
        agent = procs("agent", ["agent", "--hub", base, "--token-file", str(token_file), "--data-dir",
                                str(tmp_path / "agent"), "--tunnel-allow-port", str(echo_port)],
                      env={"SSL_CERT_FILE": str(certfile), **ice})
        wait_until(lambda: c.get(f"/v1/devices/{device_id}").json()["data"]["online"], timeout=30,
                   what="the agent online over wss", proc=agent)
        assert c.post(f"/v1/devices/{device_id}/ping").status_code == 200

    # fleethub tunnel over the same https hub (webrtc/hubcalls.py: http.client, httpx's trust): one line
    # and exit 2 while it does not trust the certificate, a session once SSL_CERT_FILE names it
    run_cli_json(["admin", "--data-dir", str(data), "tunnel-entitle", org["id"], "--enabled"])
    cli_env = {"FLEETHUB_HUB_URL": base, "FLEETHUB_PAT_ID": pat["id"], "FLEETHUB_PAT_SECRET": pat["secret"],
               "FLEETHUB_ORG_ID": org["id"], **ice}
    tunnel = ["tunnel", "--device", device_id, "--target", str(echo_port)]
    refused = subprocess.run([fleethub_exe(), *tunnel], capture_output=True, text=True, timeout=60,
                             env={**clean_env(), **cli_env}, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2 and "certificate is not trusted" in refused.stderr, refused.stderr
    assert refused.stderr.count("\n") == 1 and pat["secret"] not in refused.stderr
    cli = procs("tunnel", tunnel, env={**cli_env, "SSL_CERT_FILE": str(certfile)})
    ready = wait_until(lambda: re.search(r"tunnel ready: 127\.0\.0\.1:(\d+)", cli.log_path.read_text()),
                       timeout=60, what="the tunnel over the https hub", proc=cli)
    with socket.create_connection(("127.0.0.1", int(ready[1])), timeout=30) as conn:
        conn.sendall(b"through https and webrtc")
        conn.shutdown(socket.SHUT_WR)
        got = b""
        while data := conn.recv(65536):
            got += data
    assert got == b"through https and webrtc"
    assert cli.interrupt() == 0, cli.log_tail()
    assert "tunnel closed: stopped" in cli.log_path.read_text()


def _echo_server() -> int:
    """A TCP echo service on 127.0.0.1 (a thread per connection, daemon threads): the device's target."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1]
