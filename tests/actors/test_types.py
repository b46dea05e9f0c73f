"""The type check in CI (issue 34): mypy over actors/ (the runtime, the actors, their machines), the
actors' port (actors/services.py), the tests' one stand-in (tests/actors/standin.py), which must be
a ``Services`` as mypy reads it, and the composition root (hub/services.py) with its components. The configuration is mypy.ini (strict about definitions, Optional
and reachability; what actors import from hub/, storage/, device_client/ is read for its types only)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "actors" / "standin.py"


def mypy(*paths: str | Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), *map(str, paths)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


# The composition root and its components: mypy checks the hub's own Services against the actors' port
# where it hands itself to an actor (DeviceActor(device_id, self, ...)), and the Topology port against
# what open_services gives it (SingleNode, ClusterNode).
ROOT_MODULES = ("hub/services.py", "hub/topology.py", "storage/stores.py", "hub/auth/access.py", "hub/auth/device.py")


def test_mypy_passes_over_the_actors_their_port_the_stand_in_and_the_composition_root():
    done = mypy("actors", STANDIN, *ROOT_MODULES)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success" in done.stdout


def test_a_stand_in_short_of_an_attribute_of_the_port_fails_the_check(tmp_path):
    # The stand-in as it was before the type check found the port short of fleets (actors/device_delivery.py
    # used it): mypy must say so, or the check above would pass a stand-in without it.
    source = STANDIN.read_text()
    assert "\n    fleets: Fleets\n" in source
    (tmp_path / "short_standin.py").write_text(source.replace("\n    fleets: Fleets\n", "\n"))
    done = mypy(tmp_path / "short_standin.py")
    assert done.returncode == 1, done.stdout[-4000:]
    assert '"StandInStores" is missing following "Stores" protocol member' in done.stdout, done.stdout[-4000:]
    assert re.search(r"note: +fleets$", done.stdout, re.M), done.stdout[-4000:]
