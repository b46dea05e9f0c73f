"""The device side: what a device runs (the agent, its parts, the simulator, the qualification kit).

What the hub shares with the device sits apart in ``device_client.shared`` (the wire protocol, the link
machines, the clock, the backoff, path rules); everything else in this package is the device's own, and
the hub never imports it except to run simulated devices (``fleethub demo`` / ``sim``).
"""
