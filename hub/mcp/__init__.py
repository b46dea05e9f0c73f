"""The MCP server: /v1/mcp (endpoint.py), its handlers (server.py), its tools (tools.py), the REST
request each tool makes in-process (inproc.py) and ``fleethub mcp``, the stdio bridge (stdio.py)."""
