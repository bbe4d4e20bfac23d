# Strata: every target creates the virtualenv and installs what it needs itself.
.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help setup check-java chromium demo test test-unit lint format bench dist lock clean report-screenshot

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): requirements.lock setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Strata needs Python 3.11; set PYTHON=/path/to/python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP) check-java ## Create .venv and install every pinned dependency

check-java: ## Fail clearly unless Java 17 or newer is on PATH (Spark needs it)
	@command -v java >/dev/null 2>&1 || { echo "error: java not found. Spark needs Java 17+: install openjdk-17-jre-headless (Debian/Ubuntu) or set JAVA_HOME and PATH." >&2; exit 1; }
	@v=$$(java -version 2>&1 | awk -F'"' '/version/ {print $$2}' | cut -d. -f1); \
	  if [ "$${v:-0}" -lt 17 ]; then echo "error: java $$v found; Spark needs Java 17+: install openjdk-17-jre-headless or point JAVA_HOME at a JDK 17." >&2; exit 1; fi

chromium: ## Install Debian's chromium (headless) for the report tests, unless present
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "error: chromium not found and not root: install Debian's chromium package (apt-get install chromium)." >&2; exit 1; fi; \
	  echo "installing Debian's chromium (report tests render the HTML in it)"; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

demo: setup ## Start a local broker, seed ~100k click events, run one batch, show what landed
	$(BIN)/python -m strata.demo

test: setup chromium ## Run the whole suite (real broker, real Spark, headless Chromium)
	$(BIN)/pytest -q

test-unit: setup ## Run the fast unit tier only
	$(BIN)/pytest -q -m "not integration"

lint: setup ## ruff and mypy, both must be clean
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy strata bench

format: setup ## Apply ruff's formatting and import order
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup ## 1M and 3M JSON events: the job beside the bare consume loop and the naive peer
	$(BIN)/python -m bench.run_bench

report-screenshot: demo chromium ## Run the demo, then screenshot its quality summary page (quality-report.png)
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	  --disable-background-networking --disable-component-update --disable-sync \
	  --user-data-dir=$$(mktemp -d) --window-size=1200,2200 --hide-scrollbars \
	  --screenshot=$(CURDIR)/quality-report.png file://$(CURDIR)/demo-warehouse/clicks_quality/index.html 2>/dev/null
	@echo "wrote quality-report.png (the page: demo-warehouse/clicks_quality/index.html)"

DIST ?= dist
EXECUTOR_ENV ?= build/executor-env
dist: setup ## Build the wheel and the executors' packed environment (spark-submit --archives)
	rm -rf $(EXECUTOR_ENV) $(DIST)/strata-*.whl $(DIST)/strata-executor-env.tar.gz
	mkdir -p $(DIST)
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(DIST) .
	$(BIN)/python -m venv $(EXECUTOR_ENV)
	$(EXECUTOR_ENV)/bin/pip install --quiet -c requirements.lock $$($(BIN)/python -c \
	  'from importlib.metadata import requires; print(" ".join(r.split(";")[0].replace(" ", "") for r in requires("strata") if "extra == \"executor\"" in r))')
	$(EXECUTOR_ENV)/bin/pip install --quiet --no-deps $(DIST)/strata-*.whl
	$(BIN)/venv-pack --quiet --force -p $(EXECUTOR_ENV) -o $(DIST)/strata-executor-env.tar.gz
	@echo "built $(DIST)/strata-executor-env.tar.gz (executors: --archives ...#environment) and the wheel"

lock: ## Regenerate requirements.lock from setup.cfg (needs the registry)
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install --quiet -e '.[dev]'
	(echo "# Exact pins for every dependency, dev tools included. Regenerate with 'make lock'."; \
	  .lock-venv/bin/pip freeze --exclude-editable | sort -f) > requirements.lock
	rm -rf .lock-venv

clean: ## Remove the virtualenv, caches and local warehouses
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache demo-warehouse bench-warehouse spark-warehouse *.egg-info build dist
