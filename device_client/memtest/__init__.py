"""Memory tests on the device: a real tester over real memory (numpy over an mlocked mapping).

engine.py (memory and sweeps), patterns.py, faults.py (simulated faulty memory), confirm.py,
verdict.py, plan.py (modes, sizes, back-off), runner.py (one run), retire.py, store.py, hwsim.py,
tester.py (verbs and hooks: ``attach(device, config)``).

Attaching the tester, its hello fields and capabilities and the CLI flags import no numpy: the engine
(runner.py and what it imports) loads when a run starts, httpx when a page map is uploaded, so an
agent that never tests does not hold them (bench/agent_footprint.py, tests/device_client/test_agent_footprint.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .tester import TEST_BOOT_UNSUPPORTED, MemoryTester, MemtestConfig

if TYPE_CHECKING:
    from ..context import DeviceContext

__all__ = ["MemoryTester", "MemtestConfig", "attach"]


def attach(device: DeviceContext, config: MemtestConfig | None = None) -> MemoryTester:
    return MemoryTester(device, config).attach()


DEFAULT_SIM_BUDGET = 64 << 20
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``64M``, ``512K``, ``1G`` or a byte count (binary units)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in _UNITS else ""
    number = value[: len(value) - len(unit)]
    if not number.isdigit() or int(number) * _UNITS[unit] < 1:
        raise ValueError(f"not a size: {text!r} (e.g. 64M, 512K, 1G)")
    return int(number) * _UNITS[unit]


def add_cli_flags(parser: Any, *, sim: bool) -> None:
    """``--memory-fault KIND`` (repeatable) and ``--memory-budget SIZE`` for fleethub sim/demo/agent;
    ``--memtest-test-boot`` for the agent alone (a simulated device always offers the test boot)."""
    from .hwsim import KINDS

    who = "the i-th one applies to the i-th simulated device" if sim else "simulates faulty memory"
    parser.add_argument("--memory-fault", action="append", default=[], choices=KINDS, metavar="KIND",
                        help=f"memory fault ({', '.join(KINDS)}); repeatable: {who}")
    parser.add_argument("--memory-budget", type=parse_size, default=None, metavar="SIZE",
                        help="memory a memory test may use per device (default 64M for simulated "
                             "devices" + ("" if sim else "; without this and --memory-fault the agent "
                                          "is a real device and tests real free memory") + ")")
    if not sim:
        parser.add_argument("--memtest-test-boot", action="store_true",
                            help="this board's bootloader supports a memory-test boot (the device maker "
                                 "wired it): report test boots as available. Without it a real device "
                                 f"reports them unavailable: \"{TEST_BOOT_UNSUPPORTED}\"")


def sim_config(index: int, faults: list[str] | None, budget: int | None) -> MemtestConfig:
    """The tester of simulated device ``index``: the budget, and the index-th fault if any."""
    faults = faults or []
    return MemtestConfig(simulated=True, budget=budget or DEFAULT_SIM_BUDGET,
                         fault=faults[index] if index < len(faults) else None, fault_seed=index + 1)


def agent_config(faults: list[str] | None, budget: int | None, *, test_boot: bool = False) -> MemtestConfig:
    """``fleethub agent``: a real device unless it is given a budget or a fault to simulate.

    A real device offers a test boot only when ``test_boot`` (``--memtest-test-boot``) says its
    bootloader supports one: the spec wants x86 PCs and servers or Jetson boards on an OS image with
    support, which nothing on the device can tell the agent, and the agent knows of no bootloader
    mechanism to detect. A simulated device is the documented simulation backend and offers it."""
    if not faults and budget is None:
        return MemtestConfig(simulated=False, budget=None, test_boot=test_boot)
    return sim_config(0, faults, budget)
