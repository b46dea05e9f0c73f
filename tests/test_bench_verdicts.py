"""Benchmarks that can fail (issue 16 §6): a full run that misses an aim exits non-zero, a smoke run only
reports it, run_all gathers the verdicts, and the capacity ramp goes on past its aim until a limit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import capacity  # noqa: E402
import run_all  # noqa: E402


@pytest.fixture
def verdicts_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "VERDICTS_DIR", tmp_path)
    monkeypatch.setattr(run_all, "VERDICTS_DIR", tmp_path)
    return tmp_path


def test_a_full_run_that_misses_an_aim_fails_and_a_smoke_run_reports_it(verdicts_dir):
    full = _common.Verdicts("x", smoke=False)
    full.at_least("held", 14_000, 15_000)
    full.at_most("p99", 40, 50, " ms")
    assert [a.met for a in full.aims] == [False, True]
    assert full.exit_code() == 2
    doc = json.loads((verdicts_dir / "x.json").read_text())
    assert [a["met"] for a in doc["aims"]] == [False, True] and doc["smoke"] is False

    smoke = _common.Verdicts("x", smoke=True)
    smoke.at_least("held", 14_000, 15_000)
    assert smoke.exit_code() == 0, "a smoke run's aims are informative"
    assert smoke.exit_code(broken=True) == 1, "a broken smoke run fails"
    assert (verdicts_dir / "x-smoke.json").exists()

    met = _common.Verdicts("y", smoke=False)
    met.at_most("p99", 50, 50)
    assert met.exit_code() == 0
    nothing = _common.Verdicts("z", smoke=False)
    nothing.at_most("p99", None, 50)  # the run ended before measuring: missed, not met
    assert nothing.exit_code() == 2
    assert "**missed**" in nothing.markdown()


def test_run_all_lists_every_aim_and_the_scripts_that_broke(verdicts_dir):
    v = _common.Verdicts("capacity", smoke=False)
    v.at_least("largest N held", 20_000, 15_000)
    v.at_most("KiB per device", 52.2, 48.8, " KiB")
    v.exit_code()
    table = run_all.verdicts_section([("capacity.py", 2, 1.0), ("storm.py", 1, 1.0), ("soak.py", 0, 1.0)],
                                     smoke=False)
    assert "| capacity.py | largest N held | ≥ 15000 | 20000 | met |" in table
    assert "| capacity.py | KiB per device | ≤ 48.8 KiB | 52.2 KiB | **missed** |" in table
    assert "| storm.py | the run itself | completes without errors | exit 1 | **failed** |" in table
    assert "| soak.py | (no numeric aim: informative) |" in table


def test_the_capacity_ramp_goes_past_the_aim_until_a_limit(monkeypatch):
    sizes = capacity.sizes([1000, 15_000], 5000)
    assert [next(sizes) for _ in range(4)] == [1000, 15_000, 20_000, 25_000]
    assert list(capacity.sizes([20, 60], 0)) == [20, 60], "--no-ramp"
    assert capacity.machine_limit(85, 20, 50, 1, max_devices=80) == "--max-devices 80"
    assert capacity.machine_limit(80, 20, 50, 1, max_devices=80) is None
    # more links than loopback source ports: the machine's limit, whatever --max-devices says
    assert "ip_local_port_range" in capacity.machine_limit(10_000_000, 5000, 50, 2, max_devices=10**9)
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda _which: (1 << 20, 1 << 20))
    # more memory than the machine has
    assert "MiB available" in capacity.machine_limit(10_000, 10**9, 50, 2, max_devices=10**9)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (8000, 8000))
    assert "ulimit -n 8,000" in capacity.machine_limit(10_000, 5000, 50, 2, max_devices=10**9)


def test_run_all_fails_a_full_run_that_missed_an_aim_and_passes_the_smoke_run(tmp_path, monkeypatch, verdicts_dir):
    # a stand-in benchmark (its own process, as run_all runs every script) that misses its one aim
    script = tmp_path / "fake.py"
    script.write_text(f"""import sys
from pathlib import Path
sys.path.insert(0, {str(BENCH)!r})
import _common
_common.VERDICTS_DIR = Path({str(verdicts_dir)!r})
verdicts = _common.Verdicts("fake", smoke="--smoke" in sys.argv)
verdicts.at_least("calls/s", 1, 2)
sys.exit(verdicts.exit_code())
""")
    sections = {}
    monkeypatch.setattr(run_all, "write_section", lambda name, body, smoke: sections.setdefault(smoke, body))
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--only", str(script)])
    assert run_all.main() == 1
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--smoke", "--only", str(script)])
    assert run_all.main() == 0
    for smoke in (False, True):
        assert f"| {script} | calls/s | ≥ 2 | 1 | **missed** |" in sections[smoke]
