"""Full page maps to the hub over HTTP (device_client/shared/pagemap.py has their format).

    PUT /v1/device/memory-tests/{run}/page-map   (the device's credential; gzip'd JSON)

A map stays for the next link on a network error, a 429 or a 5xx, and is dropped on any other refusal
(it would never be taken). The tester (tester.py) decides which maps are due and that one upload runs
at a time; this is the HTTP side.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

from ..imports import load
from ..shared import outbound_tls

UPLOAD_TIMEOUT = 30.0

log = logging.getLogger("fleethub.agent.memtest")


async def upload_page_maps(device: Any, maps: list[tuple[str, Path]], done: Callable[[Path], None]) -> None:
    """PUT each ``(run id, path)`` in turn to ``device``'s hub; ``done(path)`` for each the hub took or
    refused for good; stops at the first one to try again at the next link."""
    await load("httpx")  # only a run's page maps go over HTTP
    import httpx

    tls = device.ssl_context or await outbound_tls.httpx_default()  # not built on the loop
    async with httpx.AsyncClient(verify=tls, timeout=UPLOAD_TIMEOUT) as client:
        for run_id, path in maps:
            url = f"{device.hub_url.rstrip('/')}/v1/device/memory-tests/{quote(run_id, safe='')}/page-map"
            try:
                r = await client.put(url, content=path.read_bytes(), headers={
                    **device.device_auth(), "Content-Type": "application/json", "Content-Encoding": "gzip"})
            except (httpx.HTTPError, OSError) as exc:
                log.info("memtest %s: page map upload failed (%s); again at the next link", run_id, exc)
                return
            if r.status_code >= 500 or r.status_code == 429:
                log.info("memtest %s: page map upload answered %d; again at the next link", run_id, r.status_code)
                return
            if r.status_code >= 300:
                log.warning("memtest %s: the hub refused the page map (%d): %s", run_id, r.status_code, r.text[:200])
            done(path)
