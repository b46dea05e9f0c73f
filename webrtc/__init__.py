"""Tunnels' data plane: grants (grant.py), SDP fingerprints (sdp.py), aiortc on its own asyncio thread
(loop.py, peer.py, sctp.py), TCP ⇄ data channel forwarding (forward.py), and the CLI's side
(client.py, cli_tunnel.py), the device's side (device_tunnel.py: the agent's tunnel verbs, passed to the
agent by its launcher; its configuration is device_client/tunnel.py). The hub's is hub/tunnels/."""

from webrtc import mdns as _mdns
from webrtc import mediafree as _mediafree

# before anything here imports aiortc: it then loads without PyAV (mediafree.py says why), and aioice
# without dnspython until a peer sends an mDNS candidate (mdns.py)
_mediafree.install()
_mdns.install()
