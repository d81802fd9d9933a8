# The README's two commands: `make run` and `make test`. Needs only Python >= 3.11 and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A second interpreter for the contract tests against the newest JAX (skipped, with a reason, without it).
# pyenv's shim for python3.12 exists even when 3.12 is not the active version, so try each candidate.
NEXT_PYTHON ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do \
  if "$$p" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then \
    "$$p" -c 'import sys; print(sys.executable)'; break; fi; done)
NEXT_VENV ?= .venv-jax-next
# libtpu (the build the floor JAX pins, a 213 MB download) for the compile-only TPU warm-up tests, in a venv of its own:
# with libtpu installed, a process with JAX_PLATFORMS unset starts libtpu, which queries a metadata server.
TPU_VENV ?= .venv-tpu
# checkov for tests/test_deploy.py, in a venv of its own: it pins many dependencies that must not meet ours.
TOOLS_VENV ?= .venv-tools
export CHECKOV_BIN ?= $(abspath $(TOOLS_VENV))/bin/checkov
# awscli (v1, from PyPI) for bench/stores.py's S3 baseline (`aws s3 ls`), in a venv of its own: it pins botocore.
AWSCLI_VENV ?= .venv-awscli
# Debian's Chromium, driven by Playwright in tests/test_dashboard.py (Playwright's own browser download is not used).
CHROMIUM ?= /usr/bin/chromium
# promtool, from Debian's prometheus package: tests/test_deploy_monitoring.py checks and unit-tests the alert rules.
PROMTOOL ?= /usr/bin/promtool
# setfacl, from Debian's acl package: tests/test_key_files.py gives key files ACLs.
SETFACL ?= /usr/bin/setfacl
# Test processes (pytest-xdist), one per core up to 4: most tests wait on subprocesses (JAX compiles, servers), and
# each process starts its own PostgreSQL and fake-gcs-server. 0 runs the suite in one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ "$$n" -gt 4 ] && n=4; echo $$n)
DEMO_CACHE ?= ./demo-cache
# The demo's own catalog, beside its cache: never the user's default one, which a real deployment may use.
DEMO_CATALOG ?= ./demo-catalog/catalog.sqlite
HOST ?= 127.0.0.1
PORT ?= 8080

.PHONY: run test lint clean demo-cache chromium prometheus postgres acl azurite test-setup typecheck

# The four parts, each its own distribution (core/, client/, warmup/, service/), installed in editable mode.
PARTS := ./core[gcs] ./client[gcs] ./warmup ./service
# The suite's venv takes every store's extras, in the one pip call that also brings gcsfs: s3fs's aiobotocore pins
# botocore, so boto3 (and fsspec, which gcsfs and s3fs both pin) must be resolved with it, not by a later pip call.
DEV_PARTS := ./core[gcs,s3,azure] ./client[gcs,s3,azure] ./warmup ./service
PART_FILES := core/pyproject.toml client/pyproject.toml warmup/pyproject.toml service/pyproject.toml
# The lowest JAX the client and warm-up declare (client/pyproject.toml): the main venv runs the suite on exactly it.
FLOOR_JAX ?= 0.10.2

# ml_dtypes, which every JAX imports, spends about 1 s of CPU at import from 0.7 on (its ufunc loops are registered
# through a numpy call that scans the loops already there), 0.07 s before. Every JAX supported here takes >= 0.5, and
# each JAX process of the suite and the demo pays it, so the venvs take 0.6 (bench/README.md, "The suite's time,
# again").
ML_DTYPES ?= 'ml_dtypes>=0.5,<0.7'
PIP := pip install --quiet

# $(1): the parts to install.
define make_venv
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "jaxcache needs Python >= 3.11; run: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m $(PIP) --upgrade pip
	$(PY) -m $(PIP) $(foreach p,$(1),-e '$(p)') 'jax==$(FLOOR_JAX)' 'jaxlib==$(FLOOR_JAX)' $(ML_DTYPES)
endef

$(VENV)/.stamp-run: $(PART_FILES)
	$(call make_venv,$(PARTS))
	@touch $@

$(VENV)/.stamp-dev: $(PART_FILES) pyproject.toml
	$(call make_venv,$(DEV_PARTS))
	$(PY) -m $(PIP) --group dev
	@touch $@ $(VENV)/.stamp-run

# The second JAX's and the TPU venvs: best effort, a failure only makes their tests skip with the reason. Each gets its
# JAX (the bulk of the download and unpacking) at once, side by side with the main venv; the parts come after, one venv
# at a time, because an editable install writes each part's egg-info in the checkout.
$(NEXT_VENV)/.stamp-jax:
	@if [ -n "$(NEXT_PYTHON)" ]; then \
	  echo "building $(NEXT_VENV) with $(NEXT_PYTHON) and the newest jax"; \
	  ($(NEXT_PYTHON) -m venv $(NEXT_VENV) && $(NEXT_VENV)/bin/$(PIP) --upgrade pip \
	    && $(NEXT_VENV)/bin/$(PIP) --upgrade jax $(ML_DTYPES) && touch $@) \
	    || echo "could not build $(NEXT_VENV): second-JAX contract tests will skip"; \
	else echo "no working python3.12 found: second-JAX contract tests will skip"; fi

$(NEXT_VENV)/.stamp: $(PART_FILES) | $(VENV)/.stamp-dev $(NEXT_VENV)/.stamp-jax
	@if [ -f $(NEXT_VENV)/.stamp-jax ]; then \
	  $(NEXT_VENV)/bin/$(PIP) --upgrade -e './core[gcs]' -e './client[gcs]' -e ./warmup jax $(ML_DTYPES) && touch $@ \
	    || echo "could not install the parts in $(NEXT_VENV): second-JAX contract tests will skip"; fi

$(TPU_VENV)/.stamp-jax:
	@echo "building $(TPU_VENV) with jax $(FLOOR_JAX) and the libtpu it pins (./warmup[tpu])"
	@($(PYTHON) -m venv $(TPU_VENV) && $(TPU_VENV)/bin/$(PIP) --upgrade pip \
	  && $(TPU_VENV)/bin/$(PIP) 'jax[tpu]==$(FLOOR_JAX)' 'jaxlib==$(FLOOR_JAX)' $(ML_DTYPES) && touch $@) \
	  || echo "could not build $(TPU_VENV): the compile-only TPU tests will skip"

$(TPU_VENV)/.stamp: $(PART_FILES) | $(NEXT_VENV)/.stamp $(TPU_VENV)/.stamp-jax
	@if [ -f $(TPU_VENV)/.stamp-jax ]; then \
	  $(TPU_VENV)/bin/$(PIP) -e ./core -e ./client -e './warmup[tpu]' 'jax==$(FLOOR_JAX)' 'jaxlib==$(FLOOR_JAX)' \
	    $(ML_DTYPES) && touch $@ \
	    || echo "could not install the parts in $(TPU_VENV): the compile-only TPU tests will skip"; fi

# Best effort: a failure here only makes the checkov test skip with the reason.
$(AWSCLI_VENV)/.stamp:
	$(PYTHON) -m venv $(AWSCLI_VENV)
	$(AWSCLI_VENV)/bin/$(PIP) awscli
	@touch $@

$(TOOLS_VENV)/.stamp:
	@($(PYTHON) -m venv $(TOOLS_VENV) && $(TOOLS_VENV)/bin/$(PIP) 'checkov>=3.2' && touch $@) \
	  || echo "could not build $(TOOLS_VENV): the checkov test of deploy/ will skip"

# Best effort, for the tools some tests need (without one they skip and say why): $(call debian_tool,PATH,DEFAULT,
# PACKAGES,TESTS[,APT OPTIONS]). When PATH is missing and is the DEFAULT path Debian's PACKAGES install, installs them with apt-get as
# root or with sudo, never upgrading one that is there; otherwise says that TESTS will skip.
define debian_tool
	@if [ ! -x "$(1)" ]; then \
	  if [ "$$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=no; fi; \
	  if [ "$(1)" = $(2) ] && [ "$$sudo" != no ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's $(3) for $(4)"; \
	    ($$sudo apt-get update -qq && \
	     $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade $(5) $(3)) \
	      || echo "could not install $(3): $(4) will skip"; \
	  else echo "no $(1) (make installs $(2) with apt-get as root or with sudo): $(4) will skip"; fi; \
	fi
endef

chromium:
	$(call debian_tool,$(CHROMIUM),/usr/bin/chromium,chromium,the dashboard's browser tests)

prometheus:  # Debian's prometheus ships /usr/bin/promtool
	$(call debian_tool,$(PROMTOOL),/usr/bin/promtool,prometheus,the alert rules' tests,--no-install-recommends)

acl:  # setfacl
	$(call debian_tool,$(SETFACL),/usr/bin/setfacl,acl,the tests of signing key files an ACL lets others read,\
	  --no-install-recommends)

# Best effort: Azurite (Azure Blob Storage's emulator, from npm) for the Azure storage tests, in a folder of the
# checkout; without it, or without Node.js to run it, those tests skip and say why. Node.js and npm come from Debian's
# packages where they are missing and we are root. The release is pinned: 3.36 and later need Node >= 21, and
# Debian 12's is 18.
NODE_DIR ?= .node
AZURITE_VERSION ?= 3.35.0
AZURITE ?= $(abspath $(NODE_DIR))/node_modules/.bin/azurite-blob
azurite:
	@if ! grep -qs '"version": "$(AZURITE_VERSION)"' $(NODE_DIR)/node_modules/azurite/package.json; then \
	  if ! command -v npm >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Node.js and npm from Debian's packages for Azurite (the Azure storage tests)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade nodejs npm \
	      >/dev/null) || echo "could not install Node.js and npm: the Azure storage tests will skip"; \
	  fi; \
	  if command -v npm >/dev/null 2>&1; then \
	    echo "installing Azurite $(AZURITE_VERSION) into $(NODE_DIR)/ for the Azure storage tests"; \
	    npm install --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION) >/dev/null \
	      || echo "could not install Azurite: the Azure storage tests will skip"; \
	  else echo "no npm (make installs Debian's nodejs and npm as root): the Azure storage tests will skip"; fi; \
	fi

# Best effort: PostgreSQL server binaries for the catalog's PostgreSQL tests, from Debian's packages when they are
# missing and we are root (the tests start their own server; they skip, with the reason, without the binaries).
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing PostgreSQL from Debian's packages for the catalog tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
	    || echo "could not install PostgreSQL: the PostgreSQL catalog tests will skip"; \
	else echo "no PostgreSQL server binaries and not root to install them: the PostgreSQL catalog tests will skip"; fi

# A demo cache written by plain JAX, then a warm-up and a job through jaxcache's client, so that every page of the
# dashboard (jobs, warm-ups, integrity) has something real to show. The job's second run changes its batch size: a
# miss that `jaxcache explain`, the job's page and "Top miss causes" explain (tests/test_demo.py runs this target).
# The warm-up names the job it warms (demo-job): its programs join that job's working set, and the job's exit line
# credits its hits with the warm-up's measured compile time, as the dashboard does.
demo-cache: $(VENV)/.stamp-run
	$(PY) -m jaxcache.warmup.demo $(DEMO_CACHE)
	$(PY) -m jaxcache.warmup --topology 1x1x2 --platform cpu --cache-dir $(DEMO_CACHE) --job demo-job \
	  --entrypoint jaxcache.warmup.examples:warm
	JAX_PLATFORMS=cpu JAXCACHE_DIR=$(DEMO_CACHE) JAXCACHE_JOB=demo-job $(PY) -m jaxcache.warmup.examples --devices 2
	JAX_PLATFORMS=cpu JAXCACHE_DIR=$(DEMO_CACHE) JAXCACHE_JOB=demo-job $(PY) -m jaxcache.warmup.examples --devices 2 \
	  --per-device-batch 16

# The main job: the catalog service over the demo cache, on an embedded SQLite catalog. Ctrl-C stops it. It prints
# how to serve with the admin token it keeps in demo-catalog/ (JAXCACHE_TOKENS_FILE), which applying prunes needs.
run: demo-cache
	$(VENV)/bin/jaxcache stats $(DEMO_CACHE) --top 5
	@echo "the CLI: $(VENV)/bin/jaxcache (or: . $(VENV)/bin/activate, then jaxcache), e.g. $(VENV)/bin/jaxcache ls $(DEMO_CACHE)"
	@$(PY) -m jaxcache.service.demo $(dir $(DEMO_CATALOG)) --host $(HOST) --port $(PORT)
	$(VENV)/bin/jaxcache serve --cache demo=$(DEMO_CACHE) --db sqlite:///$(abspath $(DEMO_CATALOG)) --host $(HOST) \
	  --port $(PORT)

# The type checker first (pyproject.toml [tool.mypy]: strict on the core and the client), then the suite. --durations=25
# lists the 25 slowest tests at the end, so that CI output shows where the suite's time goes.
# The venvs' stamps are looked for when the suite starts: test-setup's make builds them, this one does not know of them.
test: chromium prometheus postgres acl test-setup
	JAXCACHE_NEXT_PYTHON=$$(test -f $(NEXT_VENV)/.stamp && echo $(abspath $(NEXT_VENV))/bin/python) \
	  JAXCACHE_TPU_PYTHON=$$(test -f $(TPU_VENV)/.stamp && echo $(abspath $(TPU_VENV))/bin/python) \
	  JAXCACHE_CHROMIUM=$(CHROMIUM) JAXCACHE_PROMTOOL=$(PROMTOOL) JAXCACHE_AZURITE=$(AZURITE) $(VENV)/bin/pytest -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# The venvs and mypy side by side, without asking for `make -j`: pip unpacking and mypy checking each keep about one
# core busy, pip downloading none. The main venv, checkov's and the other two venvs' JAX start at once; mypy and the
# parts in the other venvs once the main venv is built; Azurite's npm install beside them (its apt-get, where Node.js
# is missing, runs after the other targets' apt-get: `test` makes those first).
test-setup:
	@$(MAKE) --no-print-directory -j4 typecheck $(NEXT_VENV)/.stamp $(TPU_VENV)/.stamp $(TOOLS_VENV)/.stamp azurite

typecheck: $(VENV)/.stamp-dev
	$(VENV)/bin/mypy

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check core client service warmup tests bench
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(NEXT_VENV) $(TPU_VENV) $(DEMO_CACHE) $(dir $(DEMO_CATALOG))
	rm -rf $(TOOLS_VENV) $(AWSCLI_VENV) $(NODE_DIR)
