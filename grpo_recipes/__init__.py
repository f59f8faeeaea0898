"""grpo-recipes: thin GRPO recipes and trustworthy rewards on top of Hugging Face TRL."""

import os

# Before anything imports torch: OpenMP threads that spin while they wait for work take the cores that generation,
# the sandbox and evaluation need (bench/README.md, Threads). A value set by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
