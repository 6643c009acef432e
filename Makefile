# attnbench — `make help` lists the targets. Everything runs inside .venv.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV   ?= .venv
PY     := $(VENV)/bin/python
# Installed before the project so pip never resolves `torch` to a multi-GB CUDA build on a CPU
# machine. On a GPU machine: make setup TORCH="torch==2.13.0 --index-url <your CUDA wheel index>"
TORCH  ?= torch==2.13.0
# Two stamps: what a run needs (torch and the project) and, for the tests and lint, the dev
# extra on top; `make run` on a fresh clone installs only the first (the dev extra is about a
# third of the install's time).
BASE   := $(VENV)/.installed-base
STAMP  := $(VENV)/.installed

$(BASE): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e .
	touch $@

$(STAMP): $(BASE)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

.PHONY: help setup run run-quality capacity-seeds data report test test-gpu test-fast bench-micro lint clean
help:  ## list targets
	@grep -hE '^[a-zA-Z_%-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-12s %s\n",$$1,$$2}'

setup: $(STAMP)  ## create .venv and install torch, the project and its dev extra

# The main job (its budget is 15 minutes on 2 CPU cores: docs/running.md): what each
# variant costs. Every causal variant over RUN_SEQ_LENS, one job per free core on one thread each
# (the scaling preset's launcher), each job timing its kernel in rounds
# alternating with SDPA (the crossovers) and measuring its approximation error on a trained
# reference; the O(L²) form once per length, timed the same way against SDPA, with its memory
# (every variant's speed-up over it is chained through that job: analysis/scaling_fits.py CHAINED);
# a bidirectional series (Linformer, its O(L²) form timed in its own jobs; its error, which needs
# a fit at every length, is the linformer preset's) beside them in one sweep dir; a reduced
# decode series; the quality half (QUALITY_QUICK); and one report (multirun/report). Lengths to
# 2048: 4096 cost about 4 of the job's minutes (docs/running.md) and 11–12 of 14 crossovers lie
# below 2048; `make run RUN_SEQ_LENS=256,512,1024,2048,4096` adds it, and the scaling preset
# itself goes to 16384 (re-running adds only what is missing).
RUN_SEQ_LENS ?= 256,512,1024,2048
SCALING := $(PY) -m experiments.run -m +experiment=scaling seq_len=$(RUN_SEQ_LENS)
NO_REPORT := report=false
# The decode preset reduced for the main job: every causal variant decoding onto 1K and 4K
# contexts at batch 1 (docs/decode.md).
DECODE_QUICK := sweep=decode_quick seq_len=1024,4096 batch_size=1
# The quality half: every variant trained on long-range recall at the learning rate its grid
# chose (conf/tuned/long_range_quick.yaml), accuracy at 64 and 1024 tokens, early stop at 99 %.
QUALITY_QUICK := $(PY) -m experiments.run -m +experiment=long_range_quick hydra/launcher=joblib
# One report of the main job's sweeps, with the quick quality run's when it exists.
RUN_REPORT := $(PY) -m analysis.report multirun/scaling --decode multirun/decode_quick \
	$$(test -d multirun/long_range_quick && echo --quality multirun/long_range_quick) \
	--out multirun/report

run: $(BASE)  ## the main job: what each variant costs (scaling, O(L²) and bidirectional series, decode, quality at tuned rates), one report
	$(SCALING) $(NO_REPORT)
	$(SCALING) $(NO_REPORT) attention=full attention.impl=math measure.approx_error=false
	$(SCALING) $(NO_REPORT) attention=full,linformer model.causal=false 'measure.speedup_vs=[sdpa,math]' \
		measure.approx_error=false
	$(PY) -m experiments.run -m +experiment=decode $(DECODE_QUICK) $(NO_REPORT)
	$(QUALITY_QUICK) $(NO_REPORT)
	$(RUN_REPORT)

# The main job's quality half alone (it is part of `make run`), then the report again.
run-quality: $(BASE)  ## the main job's quality half alone: quick long-range recall at tuned rates, then the report
	$(QUALITY_QUICK) $(NO_REPORT)
	$(RUN_REPORT)

data: $(BASE)  ## download enwik8 to data/enwik8.zip (needs the internet; the other tasks need no data)
	$(PY) -m experiments.training.tasks.download_enwik8 data/enwik8.zip

SWEEP ?= multirun/scaling
report: $(BASE)  ## gather a sweep's records again and redraw its report: make report SWEEP=multirun/scaling
	$(PY) -m experiments.records.store $(SWEEP)
	$(PY) -m analysis.report $(SWEEP) --out $(SWEEP)/report

# The capacity preset's second half: after its learning-rate grid (head dim 16, seed 0), seed 1
# and head dim 32 with each variant at the rate chosen on validation (analysis/tuning.py); the
# grid's own jobs are found in the store and not run again. Each job's dir is named by its
# configuration, so every variant's multirun writes its own.
capacity-seeds: $(BASE)  ## capacity: seed 1 and head dim 32 at each variant's chosen rate (after the grid)
	$(PY) -m analysis.tuning multirun/capacity --overrides | { while read -r chosen; do \
		$(PY) -m experiments.run -m +experiment=capacity hydra/launcher=joblib $$chosen \
			seed=0,1 model.n_heads=4,2 report=false || exit 1; \
	done; }
	$(PY) -m analysis.report multirun/capacity --out multirun/capacity/report

sweep-%: $(BASE)  ## run a preset sweep, e.g. make sweep-depth (smoke, scaling, depth, lsh, linformer)
	$(PY) -m experiments.run -m +experiment=$*

test: $(STAMP)  ## install, then run the default test suite (two workers; its time: docs/running.md)
	$(PY) -m pytest -q -n 2

test-gpu: $(STAMP)  ## the CUDA checks (every variant fp32/bf16 vs CPU, reversible grads, a sweep)
	$(PY) -m pytest -q -m gpu tests/gpu

test-fast: $(STAMP)  ## tests without the slow (subprocess sweep) ones
	$(PY) -m pytest -q -m "not slow"

bench-micro: $(STAMP)  ## pytest-benchmark micro-benchmarks, JSON saved, compared to the last run
	$(PY) -m pytest tests/benchmarks -m bench --benchmark-enable --benchmark-only \
		--benchmark-autosave --benchmark-compare --benchmark-columns=median,iqr,rounds

lint: $(STAMP)  ## ruff check and ruff format --check (CI runs it before the tests)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:  ## remove caches and local outputs (keeps .venv)
	rm -rf .pytest_cache .ruff_cache outputs multirun
