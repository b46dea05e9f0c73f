"""What ``fleethub tunnel`` tells an operator when it fails: one line, what happened and what to do.

Every failure the CLI can meet is a ``TunnelError`` by the time it reaches the command (client.py
turns HTTP transport errors into ``hub_unreachable``; the hub's refusals keep the hub's error code).
``one_line`` joins the error's own message with the advice for its code, so the line is the same
whether the hub's message changes or not. The hub's messages never carry a secret, and neither do
these (they name flags and environment variables, not their values).
"""

from __future__ import annotations

# The hub's error codes (hub/tunnels/, hub/auth/) and the CLI's own, with what the operator can do.
ADVICE: dict[str, str] = {
    "hub_unreachable": "check --hub (the hub's base URL) and that the hub is running",
    "no_credentials": "give --pat-id and --pat-secret (or FLEETHUB_PAT_ID and FLEETHUB_PAT_SECRET), "
                      "or FLEETHUB_TOKEN",
    "unauthenticated": "the PAT or token is wrong, expired or deleted: create a new PAT",
    "missing_organization": "give --org or FLEETHUB_ORG_ID",
    "invalid_organization": "--org (or FLEETHUB_ORG_ID) must be an organisation id",
    "forbidden": "the PAT's user is not a member of that organisation: check --org",
    "missing_relation": "ask an organisation admin for tunnel_access on this device (or its fleet)",
    "tunnel_not_entitled": "an admin can enable tunnels: fleethub admin tunnel-entitle ORG --enabled",
    "account_locked": "the organisation's billing is locked: settle the account first",
    "tunnels_unavailable": "the hub runs with tunnels off: start it with FLEETHUB_TUNNELS=on",
    "name_unknown": "check --device: names are exact and case-sensitive (in an ssh ProxyCommand give %n, "
                    "which ssh does not lowercase as it does %h), and a name finds only devices you may "
                    "view (tunnel_access alone does not: give the id)",
    "no_device_identity": "check --device; a device shows up here once its agent has connected at least once",
    "target_not_configured": "the device's agent must offer it: --tunnel-target NAME=HOST:PORT, "
                             "--tunnel-allow-port N, or --ssh for ssh (GET /v1/devices/ID shows its targets)",
    "ssh_disabled": "start the device's agent with --ssh (and --tunnel-target ssh=HOST:PORT if sshd is not "
                    "on 127.0.0.1:22)",
    "device_unsupported": "update the device's agent to one that supports tunnels",
    "device_unreachable": "the device is offline or did not answer: check that its agent runs and is online",
    "device_rejected": "the device refused the session; its agent's log says why",
    "too_many_sessions": "close another tunnel session of the organisation, or raise --max-sessions",
    "device_busy": "close another tunnel session to this device, or raise --max-sessions-per-device",
    "limit_exceeded": "open a new session",
    "rate_limited": "wait a little and try again",
    "not_connected": "no network path to the device: check its network (and the hub's TURN settings)",
    "address_in_use": "choose another --listen port, or 127.0.0.1:0 for a free one",
    "address_refused": "choose another --listen address (ports below 1024 need privileges)",
}


def one_line(message: str, code: str) -> str:
    """``message`` (a TunnelError's text) with the advice for ``code``, on one line."""
    text = " ".join(str(message).split())  # a hub message with a newline must not break the line
    advice = ADVICE.get(code)
    return f"{text}; {advice}" if advice else text
