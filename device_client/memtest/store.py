"""What the memory tester keeps on the device's disk (all JSON, written atomically).

``memtest.json``: ``retired`` (page addresses taken out of use, re-applied at every boot;
``retiredVirtual`` marks those that are offsets of a mapping rather than physical addresses),
``history`` (the newest 10 results), ``unacked`` (results the hub has not acknowledged with
memtest.ack: resent at every link), ``testBoot`` (a requested or running test boot: its runId and
plan, and ``started`` once the test boot began, so a second boot never runs it again).

``memtest-run.json``: the checkpoint of the run in progress (runId, plan, startedAt, phase, pass,
pattern), rewritten when the run reaches a new phase or pattern (not per word: a pattern is at most
a few seconds of a small device's memory). If it is still there at boot, the run died with the agent
or the device: the tester reports it as outcome interrupted.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..state import StateFile, write_atomic, write_json_atomic
from . import bounds

HISTORY = 10
UNACKED = 32  # results kept for a hub that has not acknowledged them (each is sent in its own frame)
PAGE_MAP_GLOB = "memtest-pagemap-*.json.gz"


class MemtestStore:
    def __init__(self, data_dir: Path) -> None:
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        self.state = StateFile(Path(data_dir) / "memtest.json")
        self.run_path = Path(data_dir) / "memtest-run.json"
        self.dir = Path(data_dir)

    # ---- checkpoint ----

    def checkpoint(self, record: dict[str, Any]) -> None:
        write_json_atomic(self.run_path, record)

    def load_checkpoint(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.run_path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return {"phase": "unknown"}
        return data if isinstance(data, dict) else None

    def clear_checkpoint(self) -> None:
        try:
            os.unlink(self.run_path)
        except FileNotFoundError:
            pass

    # ---- results ----

    def add_result(self, result: dict[str, Any]) -> None:
        result = bounds.bound(result)
        history = [r for r in self.state.get("history", []) if r.get("runId") != result["runId"]]
        unacked = [r for r in self.state.get("unacked", []) if r.get("runId") != result["runId"]]
        # bounded, whatever the history: results the hub never acknowledged past UNACKED are dropped
        self.state.update(history=([result] + history)[:HISTORY], unacked=(unacked + [result])[-UNACKED:])

    def history(self) -> list[dict[str, Any]]:
        # bound: results an older agent stored may hold a page map past any frame's limit
        return [bounds.bound(r) for r in self.state.get("history", [])]

    def unacked(self) -> list[dict[str, Any]]:
        return [bounds.bound(r) for r in self.state.get("unacked", [])]

    def replace_result(self, run_id: Any, result: dict[str, Any] | None) -> None:
        """Keep ``result`` in place of the stored one with this runId; None: stop sending it (the
        history keeps its brief form)."""
        history = [(result or bounds.brief(r)) if r.get("runId") == run_id else r
                   for r in self.state.get("history", [])]
        unacked = [result if r.get("runId") == run_id else r for r in self.state.get("unacked", [])]
        self.state.update(history=history, unacked=[r for r in unacked if r is not None])

    def ack(self, run_ids: list[str]) -> None:
        gone = set(run_ids)
        self.state.update(unacked=[r for r in self.state.get("unacked", []) if r.get("runId") not in gone])

    # ---- full page maps waiting for their upload (pagemap.py) ----

    def save_page_map(self, run_id: str, body: bytes) -> None:
        write_atomic(self._map_path(run_id), body)

    def page_maps(self) -> list[tuple[str, Path]]:
        """(runId, file) of each map not uploaded yet."""
        out = []
        for path in sorted(self.dir.glob(PAGE_MAP_GLOB)):
            run_id = bytes.fromhex(path.name[len("memtest-pagemap-"):-len(".json.gz")]).decode(errors="replace")
            out.append((run_id, path))
        return out[-HISTORY:]

    def page_map_done(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _map_path(self, run_id: str) -> Path:
        # hex: a runId is the hub's, any text; a file name must not be
        return self.dir / f"memtest-pagemap-{run_id.encode().hex()[:200]}.json.gz"

    # ---- retired pages, test boots ----

    def retired(self) -> list[int]:
        return list(self.state.get("retired", []))

    def add_retired(self, addresses: list[int], *, physical: bool) -> list[int]:
        """Add pages; ``physical`` False: they are offsets of the tested mapping, listed but never
        handed to the kernel's soft offlining."""
        merged = sorted(set(self.retired()) | set(addresses))
        virtual = set(self.state.get("retiredVirtual", []))
        if not physical:
            virtual |= set(addresses)
        self.state.update(retired=merged, retiredVirtual=sorted(virtual) or None)
        return merged

    def retired_physical(self) -> list[int]:
        virtual = set(self.state.get("retiredVirtual", []))
        return [a for a in self.retired() if a not in virtual]

    def test_boot(self) -> dict[str, Any] | None:
        return self.state.get("testBoot")

    def set_test_boot(self, record: dict[str, Any] | None) -> None:
        self.state.update(testBoot=record)
