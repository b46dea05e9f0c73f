"""What the hub and the device both run, apart from what only a device runs (the rest of device_client).

- ``protocol``, ``memtest_members``, ``verbs``, ``linkcodes``: the link's wire format, the verbs'
  payloads and replies, the close codes (the hub imports them to speak and check the same link);
- ``link/``: the sans-IO link machines, one for each end (``DeviceSide``, ``HubSide``);
- ``protocol_schema``: /v1/device/protocol.json and the generated tables of docs/device-protocol.md;
- ``paths``: which device paths a file may go to (the hub checks uploads, the device checks again);
- ``pagemap``: the memory-test page-map upload's format (written on the device, read by the hub);
- ``clock``, ``backoff``, ``bridge``: time as an input, the one exponential backoff, the one asyncio
  bridge (storage's asyncpg, the agent's tunnels).

Nothing here imports the device-only modules of device_client (.importlinter, "shared-is-shared"),
and importing this package loads none of its modules.
"""
