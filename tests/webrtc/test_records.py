"""webrtc/records.py: a DTLS record sealed and opened with OpenSSL's calls directly gives what pyOpenSSL's
methods give, bytes and errors alike (two real DTLS connections on memory BIOs, no IO)."""

from __future__ import annotations

import os

import pytest
from OpenSSL import SSL

from tests.webrtc.dtls import dtls_pair
from webrtc import records


@pytest.fixture(params=[True, False], ids=["direct", "pyopenssl"])
def direct(request, monkeypatch):
    monkeypatch.setattr(records, "DIRECT", request.param)
    return request.param


def test_a_chunk_sealed_on_one_side_opens_on_the_other(direct):
    a, b = dtls_pair()
    for size in (1, 1200, 1400):
        data = os.urandom(size)
        record = records.seal(a, data)
        assert record is not None and len(record) > size  # the record's header and tag around it
        assert records.open_record(b, record) == data
        assert records.open_record(a, records.seal(b, data)) == data


def test_a_record_that_does_not_decrypt_raises_what_recv_raises(direct):
    a, b = dtls_pair()
    record = bytearray(records.seal(a, b"x" * 1200))
    record[-1] ^= 0xFF  # the tag no longer matches: DTLS drops the record silently, nothing to read
    with pytest.raises(SSL.WantReadError):
        records.open_record(b, bytes(record))
    assert records.open_record(b, records.seal(a, b"after")) == b"after"  # the association lives on


def test_the_peers_close_notify_raises_zero_return(direct):
    a, b = dtls_pair()
    b.shutdown()
    with pytest.raises(SSL.ZeroReturnError):
        records.open_record(a, b.bio_read(1500))


def test_sealing_on_a_closed_connection_raises_what_send_raises(direct):
    a, _ = dtls_pair()
    a.shutdown()
    a.bio_read(1500)
    with pytest.raises(SSL.Error):
        records.seal(a, b"late")


def test_direct_and_pyopenssl_give_the_same_record_sizes():
    a, b = dtls_pair()
    data = os.urandom(1200)
    records.DIRECT = True
    try:
        direct_record = records.seal(a, data)
        records.DIRECT = False
        wrapped_record = records.seal(a, data)
    finally:
        records.DIRECT = True
    assert len(direct_record) == len(wrapped_record)
    assert records.open_record(b, direct_record) == records.open_record(b, wrapped_record) == data
