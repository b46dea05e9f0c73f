"""The device link qualification kit: ``fleethub device-test --listen HOST:PORT`` plays the hub for
one device under test and checks it against the rules of docs/device-protocol.md, printing pass or
fail per rule with the evidence (rules.py: the rules; link.py: the listening side; scenarios.py:
what it does to the device; report.py: the verdict)."""
