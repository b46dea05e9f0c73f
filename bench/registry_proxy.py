"""100 pulls of one 50 MiB image through the hub's registry proxy: upstream bytes against bytes delivered.

    python bench/registry_proxy.py [--smoke] [--pulls 100] [--mib 50]

The hub is ``fleethub serve`` in its own process (embedded PostgreSQL), Debian's ``docker-registry``
on loopback is the upstream (listed in FLEETHUB_REGISTRIES), and the image is built here with podman: a
busybox rootfs plus ``--mib`` MiB of random bytes (random so the layer does not compress), pushed to
the registry. A fleet with the proxy on holds one device; a version pins the image. Then ``--pulls``
HTTP clients at once, each with the device's token, pull the image as podman does: the manifest by
digest, then the config and the layers, hashing every body against its digest.

Between the hub and the registry a relay sends the registry's answers at a rate that makes the big
layer take ``UPSTREAM_SECONDS`` to arrive (a registry across a network, not one on the same disk), so
the time to first byte says whether the proxy streams a blob while it fetches it: it must be well
under that (a proxy that fetched whole before serving could not answer before it).

Measured: the wall time from the first request to the last byte; the time to the first byte of the
image's big layer (from its request, the earliest over the pulls); the bytes delivered to the clients;
the bytes and blob requests the registry served (its access log, so the count is the registry's own,
not the proxy's); the bytes billed for the fleet (``GET /v1/billing/registry-fallback``); the hub's CPU
seconds. Aims: each blob fetched from the registry once, and the billed bytes equal to the bytes
delivered. ``--smoke``: 10 pulls of a 4 MiB image.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (OUT_DIR, HubProcess, Verdicts, command_line, cpu_seconds, facts_line, free_port,  # noqa: E402
                     http_json, loadavg, log, machine_facts, md_table, wait_http, write_section)

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
UPSTREAM_SECONDS = 2.0  # the big layer's time through the throttled relay
ACCESS = re.compile(r'"(GET|HEAD) (/v2/\S+) HTTP/[\d.]+" (\d{3}) (\d+|-)')


def registry_with_image(work: Path, mib: int) -> tuple[subprocess.Popen, Path, str]:
    """docker-registry on a free loopback port (access log to a file) holding bench/big:1."""
    port = free_port()
    (work / "registry.yml").write_text(f"version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n"
                                       f"    rootdirectory: {work / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    access_log = work / "registry.log"
    with access_log.open("wb") as out:
        proc = subprocess.Popen(["docker-registry", "serve", str(work / "registry.yml")], stdout=out,
                                stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/v2/", 20, proc, "docker-registry")
    (work / "big.bin").write_bytes(os.urandom(mib << 20))
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        tar.add("/bin/busybox", "bin/busybox")
        tar.add(work / "big.bin", "big.bin")
    (work / "containers.conf").write_text(CONTAINERS_CONF)
    runroot = tempfile.mkdtemp(prefix="fh-bench-", dir="/tmp")  # podman wants it under 50 characters
    podman = ["podman", "--root", str(work / "store"), "--runroot", runroot, "--storage-driver", "vfs"]
    env = {**os.environ, "CONTAINERS_CONF": str(work / "containers.conf")}
    reference = f"127.0.0.1:{port}/bench/big:1"
    for args in (["import", "--change", 'CMD ["/bin/busybox", "sleep", "1d"]', str(work / "rootfs.tar"),
                  "localhost/bench/big:1"],
                 ["push", "--tls-verify=false", "localhost/bench/big:1", f"docker://{reference}"]):
        subprocess.run(podman + args, check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(["rm", "-rf", runroot, str(work / "store"), str(work / "big.bin"), str(work / "rootfs.tar")],
                   check=False)
    return proc, access_log, reference


def throttled_relay(upstream_port: int, rate: float) -> int:
    """A loopback TCP relay to ``upstream_port`` whose answers flow at ``rate`` bytes a second (each
    connection on its own); its port. Threads: the bench's hub is another process."""
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))

    def pipe(src: socket.socket, dst: socket.socket, limited: bool) -> None:
        began, sent = time.monotonic(), 0
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                sent += len(chunk)
                if limited:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        while True:
            client, _ = server.accept()
            upstream = socket.create_connection(("127.0.0.1", upstream_port))
            threading.Thread(target=pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client, True), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return port


def registry_served(access_log: Path) -> dict:
    """GETs of blobs and manifests the registry answered 200, and their bytes, from its access log."""
    blobs, manifests, sent = 0, 0, 0
    for line in access_log.read_text(errors="replace").splitlines():
        m = ACCESS.search(line)
        if m is None or m.group(1) != "GET" or m.group(3) != "200":
            continue
        blobs += "/blobs/" in m.group(2)
        manifests += "/manifests/" in m.group(2)
        sent += int(m.group(4)) if m.group(4) != "-" else 0
    return {"blob_gets": blobs, "manifest_gets": manifests, "bytes": sent}


async def pull_all(base: str, name: str, digest: str, token: str, pulls: int) -> dict:
    import httpx
    import trio

    auth = {"Authorization": "Basic " + base64.b64encode(f"bench:{token}".encode()).decode()}
    delivered, bad = 0, 0
    first_bytes: list[float] = []  # seconds from a request for the big layer to its first byte

    async def get(client, kind: str, want: str, *, timed: bool = False) -> bytes | None:
        nonlocal delivered, bad
        sha, body = hashlib.sha256(), bytearray()
        asked = time.monotonic()
        async with client.stream("GET", f"{base}/v2/{name}/{kind}/{want}", headers=auth) as r:
            if r.status_code != 200:
                bad += 1
                log(f"{kind} {want}: {r.status_code} {(await r.aread())[:300]!r}")
                return None
            async for chunk in r.aiter_raw():
                if timed and chunk:
                    timed = False
                    first_bytes.append(time.monotonic() - asked)
                sha.update(chunk)
                delivered += len(chunk)
                if kind == "manifests":
                    body += chunk
        if "sha256:" + sha.hexdigest() != want:
            bad += 1
            log(f"{kind} {want}: the body hashes to sha256:{sha.hexdigest()}")
        return bytes(body)

    async def one(client) -> None:
        manifest = await get(client, "manifests", digest)
        if manifest is None:
            return
        doc = json.loads(manifest)
        big = max(doc["layers"], key=lambda layer: layer["size"])["digest"]
        for blob in [doc["config"], *doc["layers"]]:
            await get(client, "blobs", blob["digest"], timed=blob["digest"] == big)

    limits = httpx.Limits(max_connections=pulls, max_keepalive_connections=pulls)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, connect=30), limits=limits) as client:
        t0 = time.monotonic()
        with trio.fail_after(1800):
            async with trio.open_nursery() as nursery:
                for _ in range(pulls):
                    nursery.start_soon(one, client)
        seconds = time.monotonic() - t0
    return {"seconds": round(seconds, 2), "delivered_bytes": delivered, "bad": bad,
            "layer_first_byte_seconds": round(min(first_bytes), 4) if first_bytes else None}


def direct_layer_seconds(registry: str, repository: str, digest: str) -> float:
    """A whole GET of the image's big layer straight from the registry (after the pulls: a fetch's
    duration to compare the proxy's time to first byte with)."""
    import httpx

    with httpx.Client(timeout=600) as client:
        manifest = client.get(f"http://{registry}/v2/{repository}/manifests/{digest}",
                              headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                                 "application/vnd.docker.distribution.manifest.v2+json"}).json()
        big = max(manifest["layers"], key=lambda layer: layer["size"])["digest"]
        t0 = time.monotonic()
        with client.stream("GET", f"http://{registry}/v2/{repository}/blobs/{big}") as r:
            for _ in r.iter_raw():
                pass
        return round(time.monotonic() - t0, 4)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="10 pulls of a 4 MiB image")
    p.add_argument("--pulls", type=int, default=100)
    p.add_argument("--mib", type=int, default=50)
    p.add_argument("--quiet-wait", type=float, default=120.0)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.pulls, args.mib = 10, 4
    facts = machine_facts(0 if args.smoke else args.quiet_wait)
    work = Path(tempfile.mkdtemp(prefix="fleethub-bench-proxy-"))
    registry, access_log, pushed = registry_with_image(work, args.mib)
    relay = throttled_relay(int(pushed.split("/", 1)[0].rsplit(":", 1)[1]), (args.mib << 20) / UPSTREAM_SECONDS)
    reference = f"127.0.0.1:{relay}/" + pushed.split("/", 1)[1]
    upstream = reference.split("/", 1)[0]
    registry_host = pushed.split("/", 1)[0]
    hub = HubProcess.start(name="registry-proxy", env={"FLEETHUB_REGISTRIES": upstream})
    r: dict = {"pulls": args.pulls, "image_mib": args.mib}
    broken = False
    try:
        hub.bootstrap()
        api = hub.base_url + "/v1"
        status, fleet = http_json("POST", f"{api}/fleets", {"name": "proxied", "registry_proxy": True}, hub.headers)
        assert status == 201, fleet
        status, dev = http_json("POST", f"{api}/devices", {"name": "puller", "fleet_id": fleet["data"]["id"]},
                                hub.headers)
        assert status == 201, dev
        status, cfg = http_json("POST", f"{api}/configurations", {
            "name": f"big-{secrets.token_hex(3)}", "spec": {"containers": [{"name": "big", "image": reference}]}},
            hub.headers, timeout=60)
        assert status == 201, cfg
        digest = cfg["data"]["version"]["spec"]["containers"][0]["image"].rsplit("@", 1)[1]
        before = registry_served(access_log)
        cpu0 = cpu_seconds(hub.pid)
        import trio

        name = upstream.replace(":", "__") + "/bench/big"
        r.update(trio.run(pull_all, hub.base_url, name, digest, dev["data"]["token"], args.pulls))
        r["hub_cpu_seconds"] = round(cpu_seconds(hub.pid) - cpu0, 2)
        after = registry_served(access_log)
        r["upstream_layer_seconds"] = direct_layer_seconds(upstream, "bench/big", digest)  # through the relay
        r["direct_layer_seconds"] = direct_layer_seconds(registry_host, "bench/big", digest)
        r["upstream"] = {k: after[k] - before[k] for k in after}
        status, billed = http_json("GET", f"{api}/billing/registry-fallback", headers=hub.headers)
        r["billed_bytes"] = billed["data"]["totals"]["bytes"] if status == 200 else None
        r["image_bytes"] = r["delivered_bytes"] // max(1, args.pulls)
        r["delivered_over_upstream"] = round(r["delivered_bytes"] / max(1, r["upstream"]["bytes"]), 1)
        broken = r["bad"] > 0
        log(f"{args.pulls} pulls of {args.mib} MiB in {r['seconds']} s: delivered {r['delivered_bytes']} bytes, "
            f"upstream {r['upstream']['bytes']} bytes in {r['upstream']['blob_gets']} blob GETs; billed {r['billed_bytes']}")
    except Exception as exc:  # noqa: BLE001 — a broken run is reported, not a traceback only
        log(f"broken: {exc!r}")
        r["error"] = repr(exc)
        broken = True
    finally:
        hub.stop()
        registry.terminate()
        registry.wait(10)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    verdicts = Verdicts("registry_proxy", smoke=args.smoke)
    blobs = r.get("upstream", {}).get("blob_gets")
    verdicts.at_most("blob GETs at the registry per blob of the image (config + layer)",
                     None if blobs is None else blobs / 2, 1)
    verdicts.at_most("first byte of the big layer (earliest pull, from its request) over the registry's time "
                     "to send it (through the relay)", None if not r.get("layer_first_byte_seconds")
                     or not r.get("upstream_layer_seconds") else round(r["layer_first_byte_seconds"]
                                                                       / r["upstream_layer_seconds"], 3), 0.5)
    verdicts.at_most("bytes billed for the fleet, off from the bytes delivered (either way)",
                     None if r.get("billed_bytes") is None or "delivered_bytes" not in r
                     else abs(r["billed_bytes"] - r["delivered_bytes"]), 0, " bytes")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"registry-proxy{'-smoke' if args.smoke else ''}.json").write_text(json.dumps(r, indent=1))
    print(json.dumps(r, indent=1))
    if not args.no_write and "upstream" in r:
        up = r["upstream"]
        body = "\n".join([
            "## Registry proxy: many pulls of one image (bench/registry_proxy.py)", "",
            f"`{command_line()}`", "", f"{facts_line(facts)}; load average at end {loadavg()}", "",
            md_table(["pulls", "image", "wall time", "layer's first byte", "layer from the registry (relay; direct)",
                      "delivered", "from the registry", "blob GETs at the registry", "billed", "hub CPU"],
                     [[args.pulls, f"{args.mib} MiB ({r['image_bytes']} bytes)", f"{r['seconds']} s",
                       f"{r['layer_first_byte_seconds']} s",
                       f"{r['upstream_layer_seconds']} s; {r['direct_layer_seconds']} s",
                       f"{r['delivered_bytes']} bytes", f"{up['bytes']} bytes ({up['manifest_gets']} manifest GET)",
                       up["blob_gets"], f"{r['billed_bytes']} bytes", f"{r['hub_cpu_seconds']} s"]]), "",
            (f"Delivered / fetched from the registry: {r['delivered_over_upstream']}×. The registry's figures are "
             "its own access log, counted from the first pull on (the hub pinned the version before, with one more "
             "manifest GET not counted here). "
             "Clients: HTTP (httpx, one process, all at once), each pulling as podman does (manifest by digest, "
             "config, layer) and hashing every body. The hub reaches the registry through a relay that makes "
             f"the layer take {UPSTREAM_SECONDS:g} s to arrive, so the layer's first byte shows whether the proxy "
             "streams it while it fetches it."), "",
            verdicts.markdown()])
        log(f"wrote {write_section('registry_proxy', body, smoke=args.smoke)}")
    return verdicts.exit_code(broken=broken)


if __name__ == "__main__":
    sys.exit(main())
