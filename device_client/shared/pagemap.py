"""A run's full per-page error map: more than a result lists, so it goes over HTTP, not the link.

A result lists the ``RESULT_PAGES`` pages with the most errors (bounds.py); when a run found errors
on more pages than that, the agent uploads the whole map once the result is out:

    PUT {hub}/v1/device/memory-tests/{runId}/page-map
    Authorization: Bearer <device token>, Content-Type: application/json, Content-Encoding: gzip

The body is gzip-compressed JSON (at most ``MAX_UPLOAD_BYTES`` compressed, ``MAX_JSON_BYTES``
decompressed):

    {"runId", "pageSize", "addressKind" ("physical" | "virtual"), "pagesWithErrors", "errorCount",
     "complete" (false: the runs with the fewest errors were left out to fit), "encoding": "runs",
     "runs": [[firstAddress, pageCount, errorsPerPage], ...]}

A run is consecutive pages (by address, ``pageSize`` apart) with the same error count, in address
order: a data line failing every page alike is one run, however large the memory. The hub checks it
(``parse``) and stores it; operators read it at GET /v1/devices/{id}/memory-test/results/{runId}/page-map.
"""

from __future__ import annotations

import gzip
import json
import zlib
from typing import Any

import numpy as np

MAX_UPLOAD_BYTES = 1 << 20  # the hub's request-body limit too
MAX_JSON_BYTES = 16 << 20
MAX_RUNS = 1 << 20


class Invalid(ValueError):
    """The upload is not a page map this hub accepts (the message says why)."""


def runs_of(addresses: np.ndarray, counts: np.ndarray, page_size: int) -> np.ndarray:
    """(n, 3) int64: [first address, pages, errors per page] of each run, in address order."""
    if addresses.size == 0:
        return np.zeros((0, 3), dtype=np.int64)
    order = np.argsort(addresses, kind="stable")
    a, c = addresses[order].astype(np.int64), counts[order].astype(np.int64)
    breaks = np.flatnonzero((np.diff(a) != page_size) | (np.diff(c) != 0)) + 1
    starts = np.concatenate(([0], breaks))
    lengths = np.diff(np.concatenate((starts, [a.size])))
    return np.stack((a[starts], lengths, c[starts]), axis=1)


def encode(run_id: str, runs: np.ndarray, *, page_size: int, address_kind: str, error_count: int) -> bytes:
    """The gzip body, within MAX_UPLOAD_BYTES: past it, the runs with the fewest errors go (complete false)."""
    pages = int(runs[:, 1].sum()) if runs.size else 0
    keep = runs
    if keep.shape[0] > MAX_RUNS:
        keep = _most_errors(keep, MAX_RUNS)
    while True:
        doc = {"runId": run_id, "pageSize": page_size, "addressKind": address_kind, "pagesWithErrors": pages,
               "errorCount": error_count, "complete": keep.shape[0] == runs.shape[0], "encoding": "runs",
               "runs": keep.tolist()}
        raw = json.dumps(doc, separators=(",", ":")).encode()
        body = gzip.compress(raw, compresslevel=6, mtime=0)
        if len(body) <= MAX_UPLOAD_BYTES and len(raw) <= MAX_JSON_BYTES:
            return body
        keep = _most_errors(keep, keep.shape[0] // 2)


def _most_errors(runs: np.ndarray, n: int) -> np.ndarray:
    total = runs[:, 1] * runs[:, 2]
    chosen = np.sort(np.argsort(-total, kind="stable")[:n])
    return runs[chosen]


def parse(body: bytes, run_id: str) -> dict[str, Any]:
    """The page map in ``body`` (gzip JSON), checked; Invalid otherwise. Never inflates past the cap."""
    if len(body) > MAX_UPLOAD_BYTES:
        raise Invalid(f"the page map is {len(body)} bytes; at most {MAX_UPLOAD_BYTES} are accepted")
    try:
        inflater = zlib.decompressobj(wbits=31)
        raw = inflater.decompress(body, MAX_JSON_BYTES + 1)
    except zlib.error as exc:
        raise Invalid(f"not gzip: {exc}") from None
    if len(raw) > MAX_JSON_BYTES or inflater.unconsumed_tail:
        raise Invalid(f"the page map inflates past {MAX_JSON_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise Invalid("not JSON") from None
    if not isinstance(doc, dict) or doc.get("encoding") != "runs" or doc.get("runId") != run_id:
        raise Invalid("expected an object with encoding runs and this run's runId")
    for name in ("pageSize", "pagesWithErrors", "errorCount"):
        if not _count(doc.get(name)):
            raise Invalid(f"{name} must be a non-negative integer")
    if doc.get("addressKind") not in ("physical", "virtual") or not isinstance(doc.get("complete"), bool):
        raise Invalid("addressKind must be physical or virtual, complete a boolean")
    runs = doc.get("runs")
    if not isinstance(runs, list) or len(runs) > MAX_RUNS or not all(
            isinstance(r, list) and len(r) == 3 and all(_count(v) for v in r) for r in runs):
        raise Invalid(f"runs must be at most {MAX_RUNS} [firstAddress, pageCount, errorsPerPage] triples")
    return doc


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
