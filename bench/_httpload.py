"""A small closed-loop HTTP/1.1 load generator (trio + h11, keep-alive), for bounded request counts.

    python bench/_httpload.py CONFIG.json      → one JSON object on stdout

CONFIG: {"url": "http://127.0.0.1:P", "method": "POST", "paths": [...], "headers": {...},
         "concurrency": 16, "warmup": 100, "duration": null, "timeout": 30, "field": "roundTripMs"}

``paths`` are taken in order, one per request, by ``concurrency`` connections; the first ``warmup``
are not measured. With ``duration`` set, the paths are cycled until that many seconds have passed
(wrk's fallback). ``field``: a number read from each JSON answer's ``data`` (the hub's own timing).
Every request is bounded by ``timeout``; the run as a whole by the count or the duration.
"""

from __future__ import annotations

import json
import sys
import time
from urllib.parse import urlsplit

import h11
import trio


class Client:
    def __init__(self, host: str, port: int, headers: list[tuple[str, str]]) -> None:
        self.host, self.port, self.headers = host, port, headers
        self.stream: trio.SocketStream | None = None
        self.conn: h11.Connection | None = None

    async def request(self, method: str, target: str) -> tuple[int, bytes]:
        if self.stream is None or self.conn is None or self.conn.our_state is not h11.IDLE:
            await self.close()
            self.stream = await trio.open_tcp_stream(self.host, self.port)
            self.conn = h11.Connection(h11.CLIENT)
        conn = self.conn
        hdrs = [("Host", f"{self.host}:{self.port}"), *self.headers]
        if method in ("POST", "PUT", "PATCH"):
            hdrs.append(("Content-Length", "0"))
        await self.stream.send_all(conn.send(h11.Request(method=method, target=target, headers=hdrs))
                                   + conn.send(h11.EndOfMessage()))
        status, body = 0, bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await self.stream.receive_some(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("closed mid-response")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            await self.close()
        return status, bytes(body)

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
        self.stream = self.conn = None


async def run(cfg: dict) -> dict:
    u = urlsplit(cfg["url"])
    headers = list(cfg.get("headers", {}).items())
    method, paths = cfg.get("method", "GET"), cfg["paths"]
    conc, warmup = int(cfg.get("concurrency", 1)), int(cfg.get("warmup", 0))
    timeout, duration, field = float(cfg.get("timeout", 30)), cfg.get("duration"), cfg.get("field")
    latencies: list[float] = []
    fields: list[float] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    state = {"next": 0, "measure_from": None, "measured": 0}
    stop_at = [None]

    def take() -> int | None:
        i = state["next"]
        if duration is None and i >= len(paths):
            return None
        if duration is not None and stop_at[0] is not None and time.perf_counter() >= stop_at[0]:
            return None
        state["next"] = i + 1
        return i

    async def worker() -> None:
        client = Client(u.hostname, u.port or 80, headers)
        try:
            while (i := take()) is not None:
                measured = i >= warmup
                if measured and state["measure_from"] is None:
                    state["measure_from"] = time.perf_counter()
                    if duration is not None:
                        stop_at[0] = state["measure_from"] + float(duration)
                t0 = time.perf_counter()
                try:
                    with trio.fail_after(timeout):
                        status, body = await client.request(method, paths[i % len(paths)])
                except (OSError, trio.TooSlowError, ConnectionError, h11.ProtocolError) as exc:
                    errors.append(repr(exc))
                    await client.close()
                    continue
                dt_ms = (time.perf_counter() - t0) * 1000
                if not measured:
                    continue
                state["measured"] += 1
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if 200 <= status < 300:
                    latencies.append(dt_ms)
                    if field:
                        try:
                            fields.append(float(json.loads(body)["data"][field]))
                        except (ValueError, KeyError, TypeError):
                            pass
                elif len(errors) < 20:
                    errors.append(f"HTTP {status}: {body[:200]!r}")
        finally:
            await client.close()

    async with trio.open_nursery() as nursery:
        for _ in range(conc):
            nursery.start_soon(worker)
    elapsed = time.perf_counter() - (state["measure_from"] or time.perf_counter())
    return {"latencies_ms": latencies, "field_values": fields, "statuses": statuses, "errors": errors[:20],
            "error_count": len(errors), "measured": state["measured"], "seconds": elapsed}


def summarize(latencies: list[float]) -> dict:
    from statistics import fmean

    xs = sorted(latencies)
    if not xs:
        return {"n": 0}

    def pct(q: float) -> float:
        k = max(0, min(len(xs) - 1, int(round(q / 100 * len(xs) + 0.5)) - 1))
        return round(xs[k], 3)

    return {"n": len(xs), "mean": round(fmean(xs), 3), "p50": pct(50), "p90": pct(90), "p99": pct(99),
            "max": round(xs[-1], 3)}


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        config = json.load(f)
    result = trio.run(run, config)
    result["summary"] = summarize(result["latencies_ms"])
    result["field_summary"] = summarize(result["field_values"])
    result["rps"] = round(result["measured"] / result["seconds"], 1) if result["seconds"] else 0.0
    if not config.get("keep_samples"):
        result.pop("latencies_ms")
        result.pop("field_values")
    json.dump(result, sys.stdout)
