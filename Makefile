# Stalwart developer commands. `make test` and `make demo` work from a fresh clone.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup proto lint test bench demo clean

setup: $(STAMP) proto

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

proto: $(STAMP)
	mkdir -p stalwart/v1
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. --pyi_out=. protos/stalwart/v1/*.proto
	touch stalwart/v1/__init__.py

test: setup
	$(BIN)/python -m pytest tests
