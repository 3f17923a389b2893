# specsweep: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
ARGS   ?=

.DEFAULT_GOAL := help
.PHONY: help setup run test bench clean-outputs

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

setup: $(VENV)/.installed ## create .venv/ and install the pinned requirements

run: $(VENV)/.installed ## one trial on the defaults (draft=int8 k=4); more overrides: make run ARGS="draft=bigram k=8"
	$(PY) -m src.run $(ARGS)

test: $(VENV)/.installed ## run the test suite (CPU, a tiny model trained in seconds)
	$(PY) -m pytest -q tests

bench: $(VENV)/.installed ## print the benchmark tables (loop overhead, quantized drafts)
	$(PY) -m src.bench $(ARGS)

clean-outputs: ## delete Hydra's per-run output folders (outputs/)
	rm -rf outputs
