"""GRPO on small programming tasks, rewarded by unit tests run in the sandbox; HumanEval is held out.

    accelerate launch recipes/code_grpo.py                                   # CPU default, offline
    accelerate launch recipes/code_grpo.py --max_steps 50 --max_completion_length 256
"""

import sys
from pathlib import Path

from grpo_recipes.run.runner import main

if __name__ == "__main__":
    sys.exit(main("code", default_config=Path(__file__).parent / "configs" / "code_cpu.yaml"))
