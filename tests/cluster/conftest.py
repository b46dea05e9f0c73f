import pytest

from tests.cluster.natstools import running_nats


@pytest.fixture
def nats_server():
    with running_nats() as server:
        yield server


@pytest.fixture
def nodes(tmp_path):
    """Start hub node processes with ``nodes(name, db_url, nats_url, **env)``; all killed afterwards."""
    from tests.cluster.clustertools import Node
    started: list[Node] = []

    def start(name: str, db_url: str, nats_url: str, **env: str) -> Node:
        node = Node(name, db_url, nats_url, tmp_path / "hub", tmp_path / "logs", env)
        started.append(node)
        return node

    yield start
    for node in reversed(started):
        node.proc.kill()
