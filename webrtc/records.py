"""A data chunk's DTLS record sealed and opened with OpenSSL's own calls, without pyOpenSSL's wrappers.

Every 1,200-byte SCTP chunk of a tunnel is one DTLS record: the sender calls ``Connection.send`` and
``bio_read``, the receiver ``bio_write`` and ``recv``. Each of these pyOpenSSL methods checks and
converts its argument, allocates a fresh buffer, calls OpenSSL and then asks OpenSSL for an error code
whether or not the call succeeded. For four calls per packet that wrapping cost about as much as
the encryption itself: with two connections in one process on memory BIOs, a 1,200-byte record sealed
and opened took 9.7 µs through pyOpenSSL's methods and 5.2 µs with the same four functions called
directly (``python bench/dtls_records.py``, 2026-11-28 18:25 UTC, AES-128-GCM; RESULTS.md). In the
peers: ``python bench/tunnel_ab.py --records``.

``seal`` and ``open_record`` call ``SSL_write`` / ``BIO_read`` and ``BIO_write`` / ``SSL_read`` on the
connection's own SSL object and memory BIOs, into a buffer kept per connection. Success is what they
handle; anything else (a close_notify, a record that does not decrypt, OpenSSL wanting to read) goes to
pyOpenSSL's own error mapping with OpenSSL's return value, so it raises exactly what
``send`` / ``recv`` would have, and the callers' handling is unchanged. Used by send.py and receive.py,
and so switched off with them (FLEETHUB_AIORTC_AS_IS=1); ``DIRECT = False`` goes back to pyOpenSSL's
methods (bench/tunnel_ab.py switches it between copies).
"""

from __future__ import annotations

from typing import Any

DIRECT = True  # read at every call: the A/B switches it on a running association

_RECORD = 1500  # what aiortc reads at a time: a DTLS record of one chunk, with room to spare
_cffi: tuple[Any, Any] | None = None


def bindings() -> tuple[Any, Any]:
    """pyOpenSSL's cffi ``(ffi, lib)``, looked up once."""
    global _cffi
    if _cffi is None:
        from OpenSSL._util import ffi, lib
        _cffi = (ffi, lib)
    return _cffi


def _buffer(conn: Any) -> Any:
    buf = getattr(conn, "_fleethub_record_buf", None)
    if buf is None:
        buf = conn._fleethub_record_buf = bindings()[0].new("char[]", _RECORD)
    return buf


def seal(conn: Any, data: bytes) -> bytes | None:
    """Encrypt ``data`` as one record and take it from the outgoing BIO (None when OpenSSL wrote none),
    as ``conn.send(data)`` then ``conn.bio_read(1500)``; errors raised as ``send`` raises them."""
    raw = getattr(conn, "_ssl", None)  # None: not pyOpenSSL's Connection (a test's stand-in)
    if not DIRECT or raw is None:
        from OpenSSL import SSL

        conn.send(data)
        try:
            return conn.bio_read(_RECORD) or None
        except SSL.Error:  # the BIO is empty (WantReadError): no record
            return None
    ffi, lib = bindings()
    # bytes go to a const pointer as they are (cffi passes their buffer): no from_buffer object
    written = lib.SSL_write(raw, data if type(data) is bytes else ffi.from_buffer(data), len(data))
    if written <= 0:
        conn._raise_ssl_error(raw, written)  # raises what Connection.send would
    buf = _buffer(conn)
    got = lib.BIO_read(conn._from_ssl, buf, _RECORD)
    return ffi.unpack(buf, got) if got > 0 else None


def open_record(conn: Any, data: bytes) -> bytes:
    """Feed ``data`` (a datagram) to the incoming BIO and read the plaintext, as ``conn.bio_write(data)``
    then ``conn.recv(1500)``; errors (ZeroReturnError, WantReadError, Error) raised as ``recv`` raises them."""
    raw = getattr(conn, "_ssl", None)
    if not DIRECT or raw is None:
        conn.bio_write(data)
        return conn.recv(_RECORD)
    ffi, lib = bindings()
    wrote = lib.BIO_write(conn._into_ssl, data if type(data) is bytes else ffi.from_buffer(data), len(data))
    if wrote <= 0:
        conn._handle_bio_errors(conn._into_ssl, wrote)  # raises what Connection.bio_write would
    buf = _buffer(conn)
    got = lib.SSL_read(raw, buf, _RECORD)
    if got <= 0:
        conn._raise_ssl_error(raw, got)  # raises what Connection.recv would
        return b""  # not reached: OpenSSL reports a failed read as an error
    return ffi.unpack(buf, got)  # bytes in one call, not a buffer object sliced
