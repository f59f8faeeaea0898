"""GRPO on arithmetic problems with a verifiable math reward.

    accelerate launch recipes/math_grpo.py                                   # CPU default, offline
    accelerate launch recipes/math_grpo.py --config recipes/configs/math_gsm8k_gpu.yaml
    accelerate launch recipes/math_grpo.py --learning_rate 1e-6 --max_steps 50
"""

import sys
from pathlib import Path

from grpo_recipes.run.runner import main

if __name__ == "__main__":
    sys.exit(main("math", default_config=Path(__file__).parent / "configs" / "math_cpu.yaml"))
