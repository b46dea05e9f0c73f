# Two commands on a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The hub on 127.0.0.1:8080 with the embedded PostgreSQL, a demo organisation and 3 simulated devices.
run: $(STAMP)
	$(VENV)/bin/fleethub demo --port 8080 --data-dir .fleethub --devices 3

# The whole test suite (pytest exits 5 when it collects nothing, which fails here too),
# then every benchmark at smoke size.
test: $(STAMP)
	$(PY) -m pytest
	$(PY) bench/run_all.py --smoke

# Benchmarks at full size; they update bench/RESULTS.md.
bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .fleethub .pytest_cache
