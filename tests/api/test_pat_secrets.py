"""Generated secrets are safe to pass as a command-line argument value."""

from __future__ import annotations

from hub.auth.pat import cli_safe_secret, new_pat


def test_secrets_never_start_with_a_dash():
    # one token_urlsafe value in 64 starts with "-": 5,000 draws would show a few
    drawn = [new_pat()[1] for _ in range(5000)] + [cli_safe_secret(12) for _ in range(5000)]
    assert not [s for s in drawn if s.startswith("-")]
    assert len(set(drawn)) == len(drawn) and min(len(s) for s in drawn[:5000]) >= 43
