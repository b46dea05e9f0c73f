"""The tunnel tests run with aiortc changed as a tunnel runs it, from their first test on.

webrtc/connection.py changes aiortc's and aioice's methods when the first peer connection is made. A
test that wraps one of those methods with ``monkeypatch`` (to watch the chunks sent, to drop large
datagrams) and then makes the first peers of its process would have its wrapper wrapped or replaced by
the change, and its undo would take the change away for every later test of that worker: which test
saw what depended on the order tests landed on a worker (test_pmtu.py found no DATA chunk through its
wrapper of ``_send_chunk``, which checksum.py now replaces, when it ran first). So the changes are
applied once before any test here."""

import pytest

from webrtc.connection import change_aiortc


@pytest.fixture(autouse=True, scope="session")
def aiortc_as_a_tunnel_runs_it() -> None:
    change_aiortc()
