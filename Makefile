# The two commands of the README. Each one creates or refreshes the virtual
# environment (.venv) first, so a fresh clone needs nothing but Python 3.10+.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.splice-installed

.PHONY: demo test bench docs lint format

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev,bench,docs,train,envs,multiagent]"
	touch $(STAMP)

## demo: the main job: train a recurrent PPO agent on velocity-masked CartPole (see README)
demo: $(STAMP)
	$(BIN)/splice train --algo ppo

## test: lint, format check, type check and the whole test suite (what CI runs)
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

## docs: the documentation site, tutorials executed at full size (open docs/_build/html/index.html)
docs: $(STAMP)
	SPLICE_DOCS_BUDGET=full MPLBACKEND=Agg $(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html
	@echo "docs built: open docs/_build/html/index.html"

## bench: every benchmark, splice vs TorchRL vs the raw limit
bench: $(STAMP)
	$(BIN)/python -m benchmarks

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
