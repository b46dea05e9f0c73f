"""Two real DTLS connections on memory BIOs, handshake done, as aiortc's DTLS transport holds them:
for tests/webrtc/test_records.py and bench/dtls_records.py (no IO)."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from OpenSSL import SSL


def _context() -> SSL.Context:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    context = SSL.Context(SSL.DTLS_METHOD)
    context.use_privatekey(key)
    context.use_certificate(cert)
    context.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, lambda *a: True)
    return context


def dtls_pair() -> tuple[SSL.Connection, SSL.Connection]:
    """A client and a server connection, handshake done, as aiortc's DTLS transport holds them."""
    a, b = SSL.Connection(_context()), SSL.Connection(_context())
    a.set_connect_state()
    b.set_accept_state()

    def pump(src: SSL.Connection, dst: SSL.Connection) -> None:
        try:
            while True:
                dst.bio_write(src.bio_read(1500))
        except SSL.WantReadError:
            pass

    for _ in range(10):
        for conn in (a, b):
            try:
                conn.do_handshake()
            except SSL.WantReadError:
                pass
        pump(a, b)
        pump(b, a)
    return a, b
