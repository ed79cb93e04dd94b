# The two commands of the README. Each one creates or refreshes the virtual environment
# (.venv) first, with the pinned versions of constraints.txt, so a fresh clone needs nothing
# but Python 3.11 and make (another interpreter: make PYTHON=python3.11 ...).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_STAMP := $(VENV)/.splice-demo
DEV_STAMP := $(VENV)/.splice-dev

.PHONY: demo test wheel-check bench docs format

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "splice needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) --version)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What the demo needs: splice and the `train` extra (progress bar, learning-curve figure).
$(DEMO_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[train]"
	touch $@

# Everything `make test` runs: tests, docs, benchmarks against the peers, the env zoo.
$(DEV_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,bench,docs,train,envs,multiagent]"
	touch $@ $(DEMO_STAMP)

## demo: the main job: train a recurrent PPO agent on velocity-masked CartPole (see README)
demo: $(DEMO_STAMP)
	$(BIN)/splice train --algo ppo

## test: lint, format check, type check, the whole test suite, the wheel check (what CI runs)
test: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
	$(MAKE) wheel-check

## wheel-check: build the sdist and wheel, install the wheel in a fresh venv, run the quick start
wheel-check: $(DEV_STAMP)
	$(BIN)/python .ci/check_wheel.py

## docs: the documentation site, tutorials executed at full size (open docs/_build/html/index.html)
docs: $(DEV_STAMP)
	SPLICE_DOCS_BUDGET=full MPLBACKEND=Agg $(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html
	@echo "docs built: open docs/_build/html/index.html"

## bench: every benchmark, splice vs TorchRL vs the raw limit
bench: $(DEV_STAMP)
	$(BIN)/python -m benchmarks

format: $(DEV_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
