"""Tunnels' data plane: grants (grant.py), SDP fingerprints (sdp.py), aiortc on its own asyncio thread
(loop.py, peer.py, sctp.py), TCP ⇄ data channel forwarding (forward.py), and the CLI's side
(client.py, cli_tunnel.py). The device's side is device_client/tunnel.py; the hub's is hub/tunnels/."""
