"""System facts (issue 37 item 9): the agent reads them from /proc and statvfs, the hello and telemetry
carry them, and ``systemfacts.checked`` keeps what is within bounds and says what it cut."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import trio

from device_client.shared import protocol, protocol_schema, systemfacts
from device_client.shared.clock import TestClock
from device_client.sysinfo import SystemSampler, busy_percent, cpu_counters, ip_addresses
from device_client.telemetry import Telemetry

FIB_TRIE = """Main:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
           |-- 127.0.0.1
              /32 host LOCAL
     +-- 192.0.2.0/24 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.7
              /32 host LOCAL
        |-- 192.0.2.255
           /32 link BROADCAST
Local:
           |-- 192.0.2.7
              /32 host LOCAL
"""
IF_INET6 = """00000000000000000000000000000001 01 80 10 80       lo
20010db8000000000000000000000042 02 40 00 00     eth0
fe800000000000000000000000000001 02 40 20 80     eth0
"""


def _proc(tmp_path: Path, *, idle: int = 600, total: int = 1000) -> Path:
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True, exist_ok=True)
    (proc / "uptime").write_text("12345.67 40000.00\n")
    busy = total - idle
    (proc / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (proc / "meminfo").write_text("MemTotal:       1000000 kB\nMemFree:   100 kB\nMemAvailable:    250000 kB\n")
    (proc / "net" / "fib_trie").write_text(FIB_TRIE)
    (proc / "net" / "if_inet6").write_text(IF_INET6)
    return proc


def test_the_sampler_reads_uptime_addresses_cpu_memory_and_disk(tmp_path):
    proc = _proc(tmp_path)
    sampler = SystemSampler(tmp_path, proc)
    first = sampler.sample()
    assert first["uptimeSeconds"] == 12345.7
    # loopback and link-local left out, each address once, canonical text
    assert first["ipAddresses"] == ["192.0.2.7", "2001:db8::42"]
    assert first["cpuPercent"] == 40.0  # since boot: 400 busy of 1000
    assert first["memoryTotalBytes"] == 1_024_000_000 and first["memoryPercent"] == 75.0
    assert first["diskTotalBytes"] > 0 and 0 <= first["diskPercent"] <= 100
    # the next sample is the share between the two: 100 more jiffies, 90 of them busy
    _proc(tmp_path, idle=610, total=1100)
    assert sampler.sample()["cpuPercent"] == 90.0
    assert systemfacts.checked(first) == ({**dict.fromkeys(systemfacts.SystemFacts.model_fields), **first}, [])


def test_what_cannot_be_read_is_left_out_not_guessed(tmp_path):
    sample = SystemSampler(tmp_path / "gone", tmp_path / "no-proc").sample()
    assert sample == {"ipAddresses": []}
    assert cpu_counters(tmp_path / "no-proc") is None and busy_percent((5, 10), (5, 10)) is None


def test_no_more_addresses_than_the_limit(tmp_path):
    proc = _proc(tmp_path)
    many = "".join(f"20010db80000000000000000{i:08x} 02 40 00 00 eth0\n" for i in range(40))
    (proc / "net" / "if_inet6").write_text(many)
    assert len(ip_addresses(proc)) == systemfacts.MAX_IP_ADDRESSES


def test_a_hostile_system_is_cut_to_its_bounds_and_each_change_said():
    raw = {"ipAddresses": ["10.0.0.1"] * 3 + [f"10.1.{i // 256}.{i % 256}" for i in range(50_000)] + ["not-ip", 7],
           "cpuPercent": 250, "memoryPercent": "50", "uptimeSeconds": -1, "diskPercent": True,
           "memoryTotalBytes": 2**70, "diskTotalBytes": 1000, "x" * 1000: ["y"] * 1000}
    kept, notes = systemfacts.checked(raw)
    assert kept["ipAddresses"] == ["10.0.0.1", *(f"10.1.0.{i}" for i in range(15))]
    assert kept["diskTotalBytes"] == 1000
    assert {k for k, v in kept.items() if v is None} == {"cpuPercent", "memoryPercent", "uptimeSeconds", "diskPercent",
                                                         "memoryTotalBytes"}
    assert set(kept) == set(systemfacts.SystemFacts.model_fields)  # the unknown member is not kept
    # read until sixteen are kept: the two repeats among them, not the fifty thousand past them
    assert "system.ipAddresses: 50005 given, the first 16 kept" in notes
    assert "system.ipAddresses: 2 of the first 18 are not addresses or repeat one, left out" in notes
    assert "system.cpuPercent: out of bounds or of the wrong type, left out" in notes
    assert len(notes) == 7 and len(json.dumps(kept)) < 1000


def test_a_list_of_addresses_is_read_only_as_far_as_it_must_be():
    junk = ["not-ip"] * 100 + ["192.0.2.1"]
    kept, notes = systemfacts.checked({"ipAddresses": junk})
    assert kept["ipAddresses"] == []  # past the first 64 entries nothing is read, the good one included
    assert notes == ["system.ipAddresses: 64 of the first 64 are not addresses or repeat one, left out",
                     "system.ipAddresses: 101 given, those past the first 64 not read"]
    kept, notes = systemfacts.checked({"ipAddresses": ["::1x", "2001:DB8::1", "2001:db8::1", "192.0.2.1"]})
    assert kept["ipAddresses"] == ["2001:db8::1", "192.0.2.1"]  # canonical, once each, in order
    assert notes == ["system.ipAddresses: 2 of 4 are not addresses or repeat one, left out"]
    exactly = [f"192.0.2.{i}" for i in range(16)]
    assert systemfacts.checked({"ipAddresses": exactly}) == ({**_nones(), "ipAddresses": exactly}, [])


def _nones() -> dict:
    return {name: None for name in systemfacts.SystemFacts.model_fields}


@pytest.mark.parametrize("raw", [[1, 2], "up", 5])
def test_a_system_that_is_not_an_object_is_left_out_and_said(raw):
    kept, notes = systemfacts.checked(raw)
    assert kept is None and notes and notes[0].startswith("system: an object was expected")


def test_the_schema_types_system_and_the_hello_model_keeps_a_bad_one_as_an_object():
    hello = protocol_schema.document()["frames"]["hello"]
    validator = jsonschema.Draft202012Validator(hello)
    base = {"type": "hello", "protocol": 1, "agentVersion": "x", "bootReason": "power_on"}
    assert validator.is_valid({**base, "system": {"uptimeSeconds": 5, "ipAddresses": ["192.0.2.1"]}})
    assert not validator.is_valid({**base, "system": {"cpuPercent": 101}})
    assert not validator.is_valid({**base, "system": {"ipAddresses": ["192.0.2.1"] * 17}})
    # the frame still decodes: the hub cuts the member, the link goes on
    frame = protocol.decode(json.dumps({**base, "system": {"cpuPercent": 101}}))
    assert frame.system == {"cpuPercent": 101}
    telemetry = protocol_schema.document()["events"]["telemetry"]["payload"]
    assert "system" in telemetry["properties"]


async def test_every_telemetry_sample_carries_the_system_facts(tmp_path):
    telemetry = Telemetry(tmp_path, system=lambda: {"uptimeSeconds": 1.0, "ipAddresses": []})
    telemetry.device = type("D", (), {"clock": TestClock(), "statistics": lambda self: type(
        "S", (), {"links": 1, "heartbeats_sent": 0})(), "uptime": lambda self: 2.0})()
    with trio.fail_after(5):  # the sample reads the clock, which wants a trio run
        await trio.sleep(0)
        assert telemetry.sample()["system"] == {"uptimeSeconds": 1.0, "ipAddresses": []}


def test_tunnel_targets_past_their_bounds_are_cut_and_each_cut_said():
    kept, notes = protocol.bounded_targets({"names": ["web", "x" * 65, *(f"t{i}" for i in range(100))],
                                            "ports": [22, 0, 65536, *range(1000, 1100)], "ssh": True})
    assert kept["names"] == ["web", *(f"t{i}" for i in range(63))] and kept["ssh"] is True
    assert kept["ports"] == [22, *range(1000, 1063)]
    assert notes == ["tunnelTargets.names: 1 longer than 64 characters, left out",
                     "tunnelTargets.ports: 2 not a TCP port, left out",
                     "tunnelTargets.names: 101 given, the first 64 kept",
                     "tunnelTargets.ports: 101 given, the first 64 kept"]
    assert protocol.bounded_targets({"names": ["ssh"], "ports": [22]}) == ({"names": ["ssh"], "ports": [22]}, [])
