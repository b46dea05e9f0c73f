"""Tunnel sessions on the hub: entitlements and limits, grants, TURN credentials, the session actors.

The HTTP side is hub/api/tunnels.py; the device and CLI side (webrtc/, the device's in webrtc/device_tunnel.py)
follows the contract in device_client/shared/protocol.py, section "Tunnels".
"""
