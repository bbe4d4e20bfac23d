# Strata: every target creates the virtualenv and installs what it needs itself.
.DEFAULT_GOAL := help
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Lock files (layout at the top of each): the whole dev environment, and the two
# subsets that ship, with the same pins.
DEV_LOCK := requirements.lock
RUNTIME_LOCK := requirements/runtime.lock
EXECUTOR_LOCK := requirements/executor.lock
CHECK_PYTHON := @$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "Strata needs Python 3.11; set PYTHON=/path/to/python3.11")'

.PHONY: help setup check-java kafka trino delta-spark chromium demo up down test test-scheduler test-unit lint format docs reference bench profile dist lock clean report-screenshot docs-screenshot

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-18s %s\n", $$1, $$2}'

$(STAMP): setup.cfg pyproject.toml $(DEV_LOCK)
	$(CHECK_PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r $(DEV_LOCK)
	$(BIN)/pip install --quiet --no-deps -e .
	@touch $(STAMP)

setup: $(STAMP) check-java kafka trino delta-spark ## Create .venv, install every pinned dependency, fetch Apache Kafka, Trino and delta-spark, build the JVM class archive
	@$(BIN)/python -m strata.spark.jvm

check-java: ## Fail clearly unless Java 17 or newer is on PATH (Spark needs it)
	@command -v java >/dev/null 2>&1 || { echo "error: java not found. Spark needs Java 17+: install openjdk-17-jre-headless (Debian/Ubuntu) or set JAVA_HOME and PATH." >&2; exit 1; }
	@v=$$(java -version 2>&1 | awk -F'"' '/version/ {print $$2}' | cut -d. -f1); \
	  if [ "$${v:-0}" -lt 17 ]; then echo "error: java $$v found; Spark needs Java 17+: install openjdk-17-jre-headless or point JAVA_HOME at a JDK 17." >&2; exit 1; fi

# What the local stack runs on the JVM, fetched from Maven Central through the pinned
# build files in jvm/ into the user's cache (outside the clone, so a clean clone keeps
# it), checked, and only then stamped complete (.complete, written last). Nothing
# fetches at run time. docs/development.md says what each holds.
JVM_CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/strata/jvm
MVN := mvn -B -q --strict-checksums -Dstyle.color=never
NEED_MVN = command -v mvn >/dev/null 2>&1 || { echo "error: mvn not found. make setup fetches $(1) with Maven: install maven (Debian/Ubuntu) or put mvn on PATH." >&2; exit 1; }

# $(call fetch_jars,WHAT,POM,SUMS,HOME,MANIFEST): copy the jars POM resolves into HOME,
# each checked against SUMS; quiet when HOME's stamp is SUMS. With MANIFEST=write, SUMS
# is first rewritten from what Maven resolved (after a version change in the POM).
define fetch_jars
	@set -euo pipefail; export LC_ALL=C; home="$(4)"; \
	if [ "$(5)" = check ] && cmp -s "$$home/.complete" $(3); then exit 0; fi; \
	$(call NEED_MVN,$(1)); \
	mkdir -p "$$(dirname "$$home")"; tmp=$$(mktemp -d "$$home.partial.XXXXXX"); trap 'rm -rf "$$tmp"' EXIT; \
	echo "fetching $(1) ($(2)) into $$home"; \
	$(MVN) -f $(2) dependency:copy-dependencies \
	  -Djars.dir="$$tmp/jars" >"$$tmp/mvn.log" 2>&1 || { cat "$$tmp/mvn.log" >&2; echo "error: Maven could not resolve $(2) (its output is above)" >&2; exit 1; }; \
	if [ "$(5)" = write ]; then (cd "$$tmp/jars" && sha256sum *.jar) > $(3); echo "wrote $(3)"; fi; \
	if ! diff <(cd "$$tmp/jars" && ls *.jar) <(awk '{print $$2}' $(3) | sort) >&2; then \
	  echo "error: the jars Maven resolved (<) differ from those $(3) lists (>)" >&2; exit 1; fi; \
	(cd "$$tmp/jars" && sha256sum --check --quiet --strict) < $(3) >&2 || { echo "error: a jar's SHA-256 differs from $(3); nothing was installed" >&2; exit 1; }; \
	rm -rf "$$home"; mv -T "$$tmp/jars" "$$home"; cp $(3) "$$home/.complete"
endef

# Apache Kafka for the local stack (strata.local.kafka): the jars jvm/kafka/pom.xml pins,
# each checked against jvm/kafka/jars.sha256. After a version change in the POM,
# `make kafka KAFKA_MANIFEST=write` rewrites the checksums from what Maven resolved.
KAFKA_POM := jvm/kafka/pom.xml
KAFKA_SUMS := jvm/kafka/jars.sha256
KAFKA_VERSION := $(shell sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' $(KAFKA_POM))
KAFKA_HOME := $(JVM_CACHE)/kafka-$(KAFKA_VERSION)
KAFKA_MANIFEST ?= check
kafka: check-java ## Fetch Apache Kafka's jars (jvm/kafka/pom.xml) once into the user's cache, checked; quiet when there
	$(call fetch_jars,Apache Kafka $(KAFKA_VERSION),$(KAFKA_POM),$(KAFKA_SUMS),$(KAFKA_HOME),$(KAFKA_MANIFEST))

# delta-spark for Spark sessions that read Strata's Delta tables (the tests' reference
# reader): the two jars jvm/delta-spark/pom.xml pins, checked against its jars.sha256.
DELTA_POM := jvm/delta-spark/pom.xml
DELTA_SUMS := jvm/delta-spark/jars.sha256
DELTA_VERSION := $(shell sed -n 's:.*<delta.version>\(.*\)</delta.version>.*:\1:p' $(DELTA_POM))
DELTA_HOME := $(JVM_CACHE)/delta-spark-$(DELTA_VERSION)
DELTA_MANIFEST ?= check
delta-spark: check-java ## Fetch the delta-spark jars (jvm/delta-spark/pom.xml) once into the user's cache, checked; quiet when there
	$(call fetch_jars,delta-spark $(DELTA_VERSION),$(DELTA_POM),$(DELTA_SUMS),$(DELTA_HOME),$(DELTA_MANIFEST))

# Trino for the local stack (strata.local.trino): the server tarball jvm/trino/pom.xml
# pins, copied by Maven with its published checksum checked, through a throw-away
# Maven repository (~/.m2 keeps no second copy of the 821 MB), checked against
# jvm/trino/server.sha256, and unpacked with only the plugins the local catalogs use
# (TRINO_PLUGINS; the stamp records them, so changing them unpacks again).
# `make trino TRINO_MANIFEST=write` rewrites the checksum after a version change.
TRINO_POM := jvm/trino/pom.xml
TRINO_SUM := jvm/trino/server.sha256
TRINO_VERSION := $(shell sed -n 's:.*<trino.version>\(.*\)</trino.version>.*:\1:p' $(TRINO_POM))
TRINO_HOME := $(JVM_CACHE)/trino-server-$(TRINO_VERSION)
TRINO_PLUGINS := delta-lake hive iceberg
TRINO_MANIFEST ?= check
trino: check-java ## Fetch the Trino server (jvm/trino/pom.xml, 821 MB) once into the user's cache, checked, with only the plugins used
	@set -euo pipefail; export LC_ALL=C; home="$(TRINO_HOME)"; \
	stamp="$$(cat $(TRINO_SUM); echo "plugins: $(TRINO_PLUGINS)")"; \
	if [ "$(TRINO_MANIFEST)" = check ] && [ "$$(cat "$$home/.complete" 2>/dev/null)" = "$$stamp" ]; then exit 0; fi; \
	$(call NEED_MVN,Trino $(TRINO_VERSION)); \
	mkdir -p "$$(dirname "$$home")"; tmp=$$(mktemp -d "$$home.partial.XXXXXX"); trap 'rm -rf "$$tmp"' EXIT; \
	echo "fetching Trino $(TRINO_VERSION) ($(TRINO_POM), 821 MB) into $$home"; \
	$(MVN) -f $(TRINO_POM) dependency:copy -Dserver.dir="$$tmp/download" \
	  -Dmaven.repo.local="$$tmp/repository" >"$$tmp/mvn.log" 2>&1 || { cat "$$tmp/mvn.log" >&2; echo "error: Maven could not fetch $(TRINO_POM) (its output is above)" >&2; exit 1; }; \
	if [ "$(TRINO_MANIFEST)" = write ]; then (cd "$$tmp/download" && sha256sum *.tar.gz) > $(TRINO_SUM); echo "wrote $(TRINO_SUM)"; fi; \
	(cd "$$tmp/download" && sha256sum --check --quiet --strict) < $(TRINO_SUM) >&2 || { echo "error: the tarball's SHA-256 differs from $(TRINO_SUM); nothing was installed" >&2; exit 1; }; \
	mkdir "$$tmp/server"; tar -xzf "$$tmp/download/$$(awk '{print $$2}' $(TRINO_SUM))" -C "$$tmp/server" --strip-components=1; \
	for plugin in "$$tmp/server/plugin"/*; do \
	  case " $(TRINO_PLUGINS) " in *" $${plugin##*/} "*) ;; *) rm -rf "$$plugin";; esac; done; \
	for plugin in $(TRINO_PLUGINS); do [ -d "$$tmp/server/plugin/$$plugin" ] || { echo "error: the tarball has no plugin/$$plugin" >&2; exit 1; }; done; \
	rm -rf "$$home"; mv -T "$$tmp/server" "$$home"; printf '%s\n' "$$stamp" > "$$home/.complete"

chromium: ## Install Debian's chromium (headless) for the report tests, unless present
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif command -v sudo >/dev/null 2>&1; then SUDO=sudo; \
	  else echo "error: chromium not found and not root: install Debian's chromium package (apt-get install chromium)." >&2; exit 1; fi; \
	  echo "installing Debian's chromium (report tests render the HTML in it)"; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

demo: setup ## Start a local broker, seed ~100k click events, run one batch, show what landed
	$(BIN)/python -m strata.local.demo

up: setup ## Start the playground in the background: broker, metastore, seeded clicks (docs/playground.md)
	$(BIN)/strata-local up

down: ## Stop the playground; its tables stay (strata-local down --purge deletes them)
	$(BIN)/strata-local down

test: setup chromium ## Run the whole suite but the scheduler tier (real broker, real Spark, headless Chromium)
	$(BIN)/pytest -q --durations=15 -m "not scheduler"

test-scheduler: setup chromium ## Run the scheduler tier: a real Airflow schedules the DAGs (a few minutes)
	$(BIN)/pytest -q --durations=10 -m scheduler tests/integration/scheduler

test-unit: setup ## Run the fast unit tier only (tests/unit)
	$(BIN)/pytest -q tests/unit

lint: setup ## ruff and mypy (settings in pyproject.toml), both must be clean
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy strata jobs bench

format: setup ## Apply ruff's formatting and import order
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

docs: setup ## Build the documentation site into site/ (MkDocs, --strict: a broken link or a missing page fails)
	$(BIN)/python -m strata.reference --check docs/reference
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
	@echo "built site/: open site/index.html"

reference: setup ## Regenerate docs/reference/ (configuration keys, commands, metrics, module map) from the code
	$(BIN)/python -m strata.reference docs/reference

bench: setup ## 1M and 3M JSON events: the job beside the bare consume loop and the naive peer
	$(BIN)/python -m bench.run_bench

profile: setup ## Where strata run's Python time goes (py-spy over the driver and Spark workers)
	$(BIN)/python -m bench.profile

# Batches the report's demo lands, each checked: the page plots them, the index lists them.
REPORT_BATCHES ?= 4
SCREENSHOT := chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars
report-screenshot: setup chromium ## Run the demo over several batches, then screenshot its quality page and Data Docs index
	$(BIN)/python -m strata.local.demo --batches $(REPORT_BATCHES)
	$(SCREENSHOT) --user-data-dir=$$(mktemp -d) --window-size=1200,1800 \
	  --screenshot=$(CURDIR)/quality-report.png file://$(CURDIR)/demo-warehouse/clicks_quality/index.html 2>/dev/null
	$(SCREENSHOT) --user-data-dir=$$(mktemp -d) --window-size=1200,700 \
	  --screenshot=$(CURDIR)/data-docs-index.png file://$(CURDIR)/demo-warehouse/clicks_quality/docs/index.html 2>/dev/null
	@echo "wrote quality-report.png and data-docs-index.png (the pages: demo-warehouse/clicks_quality/index.html and docs/index.html)"

docs-screenshot: docs chromium ## Build the documentation site, then screenshot its configuration reference page
	$(SCREENSHOT) --user-data-dir=$$(mktemp -d) --window-size=1280,1600 \
	  --screenshot=$(CURDIR)/docs-configuration.png file://$(CURDIR)/site/reference/configuration.html 2>/dev/null
	@echo "wrote docs-configuration.png (the page: site/reference/configuration.html)"

DIST ?= dist
EXECUTOR_ENV ?= build/executor-env
dist: setup $(EXECUTOR_LOCK) ## Build the wheel and the executors' packed environment (spark-submit --archives)
	# setuptools builds through build/lib and never empties it: a module moved or removed
	# since the last build would still ship in the wheel.
	rm -rf build/lib build/bdist.* $(EXECUTOR_ENV) $(DIST)/strata-*.whl $(DIST)/strata-executor-env.tar.gz
	mkdir -p $(DIST)
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(DIST) .
	$(BIN)/python -m venv $(EXECUTOR_ENV)
	$(EXECUTOR_ENV)/bin/pip install --quiet -r $(EXECUTOR_LOCK)
	$(EXECUTOR_ENV)/bin/pip install --quiet --no-deps $(DIST)/strata-*.whl
	$(BIN)/venv-pack --quiet --force -p $(EXECUTOR_ENV) -o $(DIST)/strata-executor-env.tar.gz
	@echo "built $(DIST)/strata-executor-env.tar.gz (executors: --archives ...#environment) and the wheel"

# Extra pip options for the dev resolve: LOCK_FLAGS='-c requirements.lock' re-splits
# the locks without upgrading anything.
LOCK_FLAGS ?=
# The executor extra's requirements, read from setup.cfg: the executors' environment
# holds them alone, not Strata's own dependencies. configparser drops the comments.
EXECUTOR_REQS := $(PYTHON) -c 'import configparser; c = configparser.ConfigParser(interpolation=None); c.read("setup.cfg"); print(c["options.extras_require"]["executor"].strip())'
lock: ## Regenerate the lock files from setup.cfg, each in a throwaway venv (needs the registry)
	$(CHECK_PYTHON)
	@set -euo pipefail; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	freeze() { "$$1/bin/pip" freeze --exclude strata | LC_ALL=C sort -f; }; \
	echo "lock: dev (.[dev])"; \
	$(PYTHON) -m venv "$$tmp/dev"; "$$tmp/dev/bin/pip" install --quiet $(LOCK_FLAGS) '.[dev]'; \
	{ echo "# Dev lock: exact pins of pip install '.[dev]': the dependencies, Airflow, the local"; \
	  echo "# stack, test and lint tools. 'make setup' installs it. requirements/runtime.lock and"; \
	  echo "# requirements/executor.lock are subsets with the same pins. Regenerate with 'make lock'."; \
	  freeze "$$tmp/dev"; } > "$$tmp/dev.lock"; \
	echo "lock: runtime (.)"; \
	$(PYTHON) -m venv "$$tmp/runtime"; "$$tmp/runtime/bin/pip" install --quiet -c "$$tmp/dev.lock" .; \
	{ echo "# Runtime lock: exact pins of pip install . (the dependencies, no extra), the same"; \
	  echo "# pins as requirements.lock. Regenerate with 'make lock'."; \
	  freeze "$$tmp/runtime"; } > "$$tmp/runtime.lock"; \
	echo "lock: executor (the executor extra alone)"; \
	$(PYTHON) -m venv "$$tmp/executor"; $(EXECUTOR_REQS) > "$$tmp/executor.in"; \
	"$$tmp/executor/bin/pip" install --quiet -c "$$tmp/dev.lock" -r "$$tmp/executor.in"; \
	{ echo "# Executor lock: exact pins of the executor extra alone, what 'make dist' installs into"; \
	  echo "# the executors' packed environment (they take pyspark from their Spark installation),"; \
	  echo "# the same pins as requirements.lock. Regenerate with 'make lock'."; \
	  freeze "$$tmp/executor"; } > "$$tmp/executor.lock"; \
	for f in runtime executor; do \
	  if grep -v '^#' "$$tmp/$$f.lock" | grep -vxFf "$$tmp/dev.lock"; then \
	    echo "error: the pins above of $$f.lock differ from the dev lock's" >&2; exit 1; fi; \
	done; \
	mkdir -p requirements; \
	mv "$$tmp/dev.lock" $(DEV_LOCK); mv "$$tmp/runtime.lock" $(RUNTIME_LOCK); mv "$$tmp/executor.lock" $(EXECUTOR_LOCK); \
	echo "wrote $(DEV_LOCK) $(RUNTIME_LOCK) $(EXECUTOR_LOCK)"

clean: ## Remove the virtualenv, caches and local warehouses
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache demo-warehouse bench-warehouse spark-warehouse *.egg-info build dist site
