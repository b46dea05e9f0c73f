import pytest

from tests.cluster.natstools import running_nats


@pytest.fixture
def nats_server():
    with running_nats() as server:
        yield server
