"""The rules a device must keep, each with an id the kit prints and docs/device-protocol.md lists
(the "Qualification rules" block is rendered from this table)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    section: str  # the document's section that states it
    text: str


RULES: tuple[Rule, ...] = (
    Rule("T1", "Transport and authentication", "connects to /v1/device/link with Authorization: Bearer <device token>"),
    Rule("T2", "Transport and authentication", "after a handshake answered HTTP 401 the device retries no "
                                               "sooner than its slowest backoff (its backoff cap; the kit wants at least 10 s)"),
    Rule("H1", "Hello", "the first frame is a hello, sent within 10 s of the handshake"),
    Rule("H2", "Hello", "the hello matches the schema (field types; system facts, tunnel targets and agentVersion "
                        "within their bounds)"),
    Rule("H3", "Versions", "the hello names a supported protocol version, or none (version 1)"),
    Rule("H4", "Reboots and boot reasons", "bootReason is a snake_case word"),
    Rule("B1", "Heartbeats", "heartbeat events arrive every welcome.heartbeatInterval (none missed, none at twice the rate)"),
    Rule("B2", "Heartbeats", "heartbeat payloads match the schema"),
    Rule("C1", "Verbs", "ping is answered {pong: true, deviceClock}"),
    Rule("C2", "Commands and replies", "every command gets a reply frame with its id, ok and payload or error"),
    Rule("C3", "Commands and replies", "an unknown verb is answered ok: false, unknown_command"),
    Rule("C4", "Commands and replies", "a command addressed to another device is answered ok: false, wrong_device"),
    Rule("C5", "Commands and replies", "a malformed payload is answered ok: false with an error code; the link stays up"),
    Rule("C6", "Frames", "a text frame that is not a frame is ignored; the link stays up"),
    Rule("I1", "Idempotency", "a command id seen before is answered with the first reply, without doing the work again"),
    Rule("F1", "Secret files and configurations", "files.put answers one result per file, in order: on_device with the file's sha256"),
    Rule("F2", "Secret files and configurations", "a file that cannot be written fails on its own (failed, error) and the others are written"),
    Rule("F3", "Limits", "a file over 64 KiB fails with an error"),
    Rule("F4", "Secret files and configurations", "files.delete answers removed for each path"),
    Rule("F5", "Secret files and configurations", "files.wipe removes every file the hub put and lists it in removed"),
    Rule("F6", "Hello", "after a reconnect, hello.secretFileDigests lists the files on the device with their sha256"),
    Rule("A1", "Secret files and configurations", "config.apply answers a ConfigApplyResult: applied, its ids, its files on_device"),
    Rule("A2", "Events", "a config.apply result is also sent as event config.result"),
    Rule("A3", "Hello", "after a reconnect, hello.configVersionApplied names the applied version"),
    Rule("A4", "Secret files and configurations", "an invalid spec is answered rejected with an error and "
                                                  "rolledBackTo the version the device runs, also as event config.result"),
    Rule("A5", "Secret files and configurations", "an apply interrupted by a link drop: the next hello names "
                                                  "the version the device ran until the new one is verified, and the "
                                                  "resent id gets the result; a reboot waits for the apply's reply"),
    Rule("K1", "Verbs", "link.keys replaces the hub keys and answers their kids"),
    Rule("K2", "Verbs", "link.keys with a key that is not Ed25519 is refused (invalid_payload)"),
    Rule("M1", "Events", "a started memory test's replies and memtest.progress, memtest.result and "
                         "memtest.health events match the link schema and name the run (optional verbs)"),
    Rule("R1", "Reboots and boot reasons", "reboot is answered {rebooting: true}, then the device closes the link"),
    Rule("R2", "Reboots and boot reasons", "the device comes back with a hello whose bootReason is the reboot's reason"),
    Rule("R3", "Idempotency", "the reboot's command id sent again after the reboot gets the stored reply and no second reboot"),
    Rule("R4", "Reboots and boot reasons", "after a reboot with no reason the hello says reboot, not the "
                                           "reason of the boot before; a reconnect without a reboot keeps the boot's reason"),
    Rule("D1", "Close codes", "link.drain is answered, the device closes with 1001 and reconnects within reconnectAfter"),
    Rule("L1", "Limits", "a frame over the limit is not answered: the device closes with 1009 and a reason, then reconnects"),
    Rule("X1", "Close codes", "after close 4002 (heartbeat timeout) the device reconnects with backoff: over 5 links "
                              "the kit closes before its welcome it stays away at least 1 s in all, not in an immediate loop"),
    Rule("X3", "Close codes", "after close 4004 (draining) the device reconnects within the window its reason states"),
    Rule("X4", "Close codes", "after close 4408 (hello timeout) the device reconnects and sends its hello at once (within 1 s)"),
    Rule("X5", "Close codes", "after close 4003 (token revoked) the device stays away its slowest backoff "
                              "(its backoff cap; the kit wants at least 10 s)"),
    Rule("X6", "Close codes", "after close 4409 (out of order) the device reconnects and sends its hello "
                              "once per link, and no welcome or command"),
    Rule("X7", "Close codes", "after close 4426 (unknown version) the device comes back with a version the "
                              "reason lists, or after its slowest backoff (the kit wants at least 10 s)"),
    Rule("X2", "Close codes", "after close 4001 (superseded) the device waits at least the superseded backoff"),
)
BY_ID = {r.id: r for r in RULES}
