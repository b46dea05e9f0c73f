"""hub/proxied.py: which X-Forwarded-* entry is believed, for how many proxies in front."""

from __future__ import annotations

from hub.proxied import apply_forwarded


def scope(kind: str = "http", **headers: str) -> dict:
    return {"type": kind, "scheme": "http" if kind == "http" else "ws", "client": ("10.0.0.9", 40000),
            "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]}


def test_no_trusted_proxy_keeps_the_peer_whatever_the_client_wrote():
    s = scope(x_forwarded_for="203.0.113.7", x_forwarded_proto="https")
    apply_forwarded(s, 0)
    assert s["client"] == ("10.0.0.9", 40000) and s["scheme"] == "http"


def test_one_proxy_believes_only_the_entry_it_appended():
    # the client forged the first entry; the proxy appended the address it saw
    s = scope(x_forwarded_for="198.51.100.1, 203.0.113.7", x_forwarded_proto="https")
    apply_forwarded(s, 1)
    assert s["client"] == ("203.0.113.7", 0) and s["scheme"] == "https"


def test_entries_across_repeated_headers_count_in_order():
    s = scope()
    s["headers"] = [(b"X-Forwarded-For", b"198.51.100.1"), (b"x-forwarded-for", b"203.0.113.7, 10.0.0.2")]
    apply_forwarded(s, 2)
    assert s["client"] == ("203.0.113.7", 0)


def test_a_request_that_skipped_the_proxies_keeps_its_peer():
    s = scope(x_forwarded_for="203.0.113.7")  # one entry, two proxies expected: it did not pass both
    apply_forwarded(s, 2)
    assert s["client"] == ("10.0.0.9", 40000)
    s = scope()  # the proxy's own health check carries no header
    apply_forwarded(s, 1)
    assert s["client"] == ("10.0.0.9", 40000) and s["scheme"] == "http"


def test_a_websocket_through_a_tls_proxy_is_wss():
    s = scope("websocket", x_forwarded_for="203.0.113.7", x_forwarded_proto="https")
    apply_forwarded(s, 1)
    assert s["scheme"] == "wss" and s["client"] == ("203.0.113.7", 0)


def test_an_unknown_proto_changes_nothing_and_lifespan_is_left_alone():
    s = scope(x_forwarded_proto="gopher")
    apply_forwarded(s, 1)
    assert s["scheme"] == "http"
    life = {"type": "lifespan"}
    apply_forwarded(life, 1)
    assert life == {"type": "lifespan"}
