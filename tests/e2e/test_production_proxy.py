"""The production guide's reverse proxy, run: packaging/haproxy/fleethub.cfg as shipped (but for the
certificate, the bind address and the hub's port) ends TLS in front of `fleethub serve` with
FLEETHUB_TRUSTED_PROXY_HOPS=1. Through it: REST with a PAT over HTTP/2, a device's event stream
delivering the event of a real `fleethub agent` linking over wss (trusting the test's certificate
through SSL_CERT_FILE, as docs/production.md tells), a command to that device, per-address sign-in
throttling that counts each client's address rather than the proxy's, and a Secure session cookie; /metrics refused at the proxy."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.certs import self_signed
from tests.e2e.clitools import free_port, run_cli_json, wait_until

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SHIPPED = Path(__file__).resolve().parents[2] / "packaging" / "haproxy" / "fleethub.cfg"


def proxy_config(cert_pem: Path, port: int, hub_port: int) -> str:
    """The shipped file with this test's three values; each is replaced exactly once."""
    text = SHIPPED.read_text()
    for old, new in (("/etc/haproxy/certs/fleethub.pem", str(cert_pem)), ("bind :443 ", f"bind 127.0.0.1:{port} "),
                     ("127.0.0.1:8080", f"127.0.0.1:{hub_port}")):
        assert text.count(old) == 1, f"{SHIPPED} no longer has exactly one {old!r}"
        text = text.replace(old, new)
    return text


def client_from(address: str, trust: ssl.SSLContext, base: str, headers: dict | None = None) -> httpx.Client:
    """A client whose connections leave from ``address`` (any 127.x address is this machine's)."""
    transport = httpx.HTTPTransport(local_address=address, verify=trust, http2=True)
    return httpx.Client(base_url=base, transport=transport, headers=headers or {}, timeout=30)


def sse_events(lines, deadline: float):
    """(event name, data) pairs from an SSE response's lines until ``deadline``."""
    name, data = None, []
    for line in lines:
        if time.monotonic() > deadline:
            raise AssertionError("the event stream delivered nothing in time")
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and name is not None:
            yield name, json.loads("\n".join(data))
            name, data = None, []


def test_hub_behind_haproxy_with_tls(tmp_path, procs):
    if not Path(HAPROXY).exists():
        pytest.skip("haproxy is not installed (Debian's haproxy package: make system-deps)")
    certfile, keyfile = self_signed(tmp_path)
    pem = tmp_path / "fleethub.pem"  # HAProxy takes the certificate and its key in one file
    pem.write_bytes(certfile.read_bytes() + keyfile.read_bytes())
    pem.chmod(0o600)
    data, hub_port, port = tmp_path / "hub", free_port(), free_port()
    serve = procs("serve", ["serve", "--port", str(hub_port), "--data-dir", str(data)],
                  env={"FLEETHUB_TRUSTED_PROXY_HOPS": "1"})
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(proxy_config(pem, port, hub_port))
    log = (tmp_path / "haproxy.log").open("wb")
    proxy = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    try:
        base = f"https://127.0.0.1:{port}"
        trust = ssl.create_default_context(cafile=str(certfile))
        wait_until(lambda: httpx.get(base + "/readyz", verify=trust, timeout=2).status_code == 200,
                   timeout=60, what="the hub ready through HAProxy", proc=serve)
        org = run_cli_json(["admin", "--data-dir", str(data), "create-org", "Proxy Org"])
        run_cli_json(["admin", "--data-dir", str(data), "create-user", "ops@proxy.test", "--org", org["id"],
                      "--role", "admin", "--password", "a long enough password"])
        pat = run_cli_json(["admin", "--data-dir", str(data), "create-pat", "ops@proxy.test"])
        headers = {"X-API-Token-ID": pat["id"], "X-API-Secret-Key": pat["secret"], "X-Organization-ID": org["id"]}

        assert httpx.get(base + "/metrics", verify=trust, timeout=5).status_code == 403  # for the scraper only
        assert httpx.get(f"http://127.0.0.1:{hub_port}/metrics", timeout=5).status_code == 200

        with client_from("127.0.0.3", trust, base, headers) as c:
            r = c.post("/v1/devices", json={"name": "edge-1"})
            assert r.status_code == 201 and r.http_version == "HTTP/2", (r.status_code, r.http_version, r.text)
            device_id, token = r.json()["data"]["id"], r.json()["data"]["token"]
            token_file = tmp_path / "token"
            token_file.write_text(token)
            token_file.chmod(0o600)

            with c.stream("GET", f"/v1/devices/{device_id}/events") as stream:
                assert stream.status_code == 200, stream.read()
                events = sse_events(stream.iter_lines(), time.monotonic() + 60)
                kind, first = next(events)
                assert kind == "device.snapshot" and first["payload"]["online"] is False, first
                agent = procs("agent", ["agent", "--hub", base, "--token-file", str(token_file),
                                        "--data-dir", str(tmp_path / "agent")],
                              env={"SSL_CERT_FILE": str(certfile)})
                for kind, event in events:  # the agent's link through HAProxy, told on the stream
                    if kind == "device.state" and event["payload"]["online"]:
                        break
                    assert agent.popen.poll() is None, agent.log_tail()
            r = c.post(f"/v1/devices/{device_id}/ping")
            assert r.status_code == 200, r.text  # hub → HAProxy → agent and back over the wss link

        # Sign-in attempts are counted per client address (20 in 15 minutes): the proxy's own address
        # would make one client's failures lock everyone out.
        with client_from("127.0.0.4", trust, base) as guesser:
            answers = [guesser.post("/v1/auth/login", json={"email": f"nobody{i}@proxy.test", "password": "x"})
                       .status_code for i in range(21)]
        assert answers == [401] * 20 + [429], answers
        with client_from("127.0.0.5", trust, base) as operator:
            r = operator.post("/v1/auth/login", json={"email": "ops@proxy.test", "password": "a long enough password"})
            assert r.status_code == 200, r.text
            # TLS ended at the proxy; X-Forwarded-Proto tells the hub, so the cookie is for HTTPS only
            cookie = r.headers["set-cookie"]
            assert "Secure" in cookie and "HttpOnly" in cookie, cookie
    finally:
        proxy.terminate()
        proxy.wait(10)
        log.close()
