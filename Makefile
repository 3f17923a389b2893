# specsweep: `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
ARGS   ?=
PREDICT_ARGS ?=
SWEEP  ?= paper
TEST_WORKERS ?= auto   # pytest-xdist workers for make test / test-fast (auto: one per core)
TORCH_INDEX ?=         # a wheel index for torch alone, e.g. PyTorch's CPU-only index (empty: pip's configured index)

.DEFAULT_GOAL := help
.PHONY: help setup run sweep ui analyze predict test test-fast readme-example regenerate bench bench-sweep bench-predict bench-noise bench-drafts bench-ceiling bench-folder retrain-default export clean-outputs
.PHONY: setup-cluster tracking-server tracking-server-stop ray-up ray-down

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-21s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(strip $(TORCH_INDEX)),$(PY) -m pip install --quiet --index-url $(strip $(TORCH_INDEX)) $(shell grep -o '^torch==[^ ]*' requirements.txt))
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

setup: $(VENV)/.installed ## create .venv/ and install the pinned requirements (TORCH_INDEX=URL: torch from that index, e.g. the CPU-only build)

$(VENV)/.installed-cluster: $(VENV)/.installed requirements-cluster.txt
	$(PY) -m pip install --quiet -r requirements-cluster.txt
	touch $@

setup-cluster: $(VENV)/.installed-cluster ## add the optional cluster extra (Ray, submitit, PostgreSQL driver) to .venv/

run: $(VENV)/.installed ## one trial on the defaults (draft=int8 k=4); more overrides: make run ARGS="draft=bigram k=8"
	$(PY) -m src.run $(ARGS)

sweep: $(VENV)/.installed ## run a named sweep from sweeps/ (SWEEP=NAME of a file in sweeps/: paper, drafts, drafts_quick, scaling, smoke, ...; ARGS=overrides)
	$(PY) -m src.run --config-dir sweeps --config-name $(SWEEP) $(ARGS)

ui: $(VENV)/.installed ## the MLflow UI on http://127.0.0.1:5000 for the store in use (MLFLOW_TRACKING_URI, else mlruns/)
	$(PY) -m src.sweep.store ui

analyze: $(VENV)/.installed ## tables, cost models and figures of the latest sweep (ARGS="--sweep-id ID")
	$(PY) -m analysis.report $(ARGS)

predict: $(VENV)/.installed ## predict a draft's speedup per k without a sweep, 2-3 minutes a draft on 2 cores (ARGS="draft=ngram k=2,4,8 --fit-sweep ID"; ARGS="--validate --sweep-id ID")
	$(PY) -m src.predict $(ARGS)

test: $(VENV)/.installed ## the whole test suite on every core (CPU; the cluster tests too once `make setup-cluster` has run; TEST_WORKERS=0: in this process)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 tests

test-fast: $(VENV)/.installed ## the tests not marked slow: the edit-test loop (about 2 minutes on 2 cores)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 -m "not slow" tests

readme-example: $(VENV)/.installed ## run the README's one-trial example on the default model and write its output into README.md
	$(PY) -m src.readme_example

regenerate: $(VENV)/.installed ## rewrite the generated texts: the sweeps' table and what runs where (--help, README.md, conf/'s "# runs:" lines)
	$(PY) -m src.sweep.catalog --write
	$(PY) -m src.trial.capabilities --write

bench: $(VENV)/.installed ## print the benchmark tables (loop overhead, int8 kernels vs fake int8, quantized drafts; ARGS="+bench=kernels model=NAME")
	$(PY) -m src.bench.bench $(ARGS)

bench-sweep: $(VENV)/.installed ## a sweep run three times (n_jobs=1, again at 1, at 2): timing agreement, harness overhead, wall ratio (ARGS=--n1-only: one run, the overhead alone)
	$(PY) -m src.bench.harness --sweep $(SWEEP) $(ARGS)

bench-predict: $(VENV)/.installed ## the prediction's held-out error: a named sweep (SWEEP=NAME; ARGS=its overrides, --seeds, --probe-runs) one round of seeds at a time, each round followed by a probe run of every cell, then each cell predicted beside measured, the error per regime (PREDICT_ARGS=src.predict's arguments)
	$(PY) -m src.bench.predict_rounds --sweep $(SWEEP) $(ARGS) -- $(PREDICT_ARGS)

bench-noise: $(VENV)/.installed ## the sweep quiet, then under a CPU hog (n_jobs=1): cell agreement, pairs, model errors, fits, advice (ARGS="--seeds 0,1 --hog-cores 1")
	$(PY) -m src.bench.noise --sweep $(SWEEP) $(ARGS)

bench-drafts: $(VENV)/.installed ## table drafts (ngram, distilled) by context length: acceptance, cost c, cold cost, memory (ARGS="--orders 4,6 distilled.distill_chars=400000")
	$(PY) -m src.bench.drafts $(ARGS)

bench-ceiling: $(VENV)/.installed ## what any draft-length policy could gain over the best fixed k, per draft and price per drafted char (ARGS="--drafts ngram --prices 0.065,0.3")
	$(PY) -m src.bench.policy_ceiling $(ARGS)

export: $(VENV)/.installed ## write a target as a transformers checkpoint (ARGS="DIR [overrides]"), then: python -m src.run model=hf model.path=DIR
	$(PY) -m src.export $(ARGS)

bench-folder: $(VENV)/.installed ## a GPT-2-small-shaped model from a folder and a 2-layer draft: load time, memory, pass and verify costs (ARGS="--layers 6")
	$(PY) -m src.bench.folder_model_size $(ARGS)

retrain-default: $(VENV)/.installed ## retrain the shipped default target (src/engine/models/weights/) and compare: 10-25 min on 2 cores (ARGS=--ship: replace it)
	$(PY) -m src.bench.retrain $(ARGS)

tracking-server: $(VENV)/.installed-cluster ## MLflow server on PostgreSQL, both on 127.0.0.1, data in .cluster/ (ARGS="--port 5001 --pg-port 5433")
	$(PY) -m src.cluster.servers tracking-up $(ARGS)

tracking-server-stop: $(VENV)/.installed ## stop what `make tracking-server` started
	$(PY) -m src.cluster.servers tracking-down

ray-up: $(VENV)/.installed-cluster ## a Ray head on 127.0.0.1:6379, logs in .cluster/ray (ARGS="--workers 1 --num-cpus 1")
	$(PY) -m src.cluster.servers ray-up $(ARGS)

ray-down: $(VENV)/.installed ## stop what `make ray-up` started
	$(PY) -m src.cluster.servers ray-down

clean-outputs: ## delete Hydra's per-run output folders (outputs/)
	rm -rf outputs
