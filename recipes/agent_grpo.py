"""GRPO for tool use: multi-turn episodes where the model calls tools (tools/*.py) and is scored on its final answer.

    accelerate launch recipes/agent_grpo.py           # CPU default, offline: an sft stage of tool episodes, then GRPO
    accelerate launch recipes/agent_grpo.py --config recipes/configs/agent_gpu.yaml
"""

import sys
from pathlib import Path

from grpo_recipes.run.runner import main

if __name__ == "__main__":
    sys.exit(main("agent", default_config=Path(__file__).parent / "configs" / "agent_cpu.yaml"))
