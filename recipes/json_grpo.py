"""GRPO on structured extraction: a short text -> one JSON object that must validate against the row's schema.

    accelerate launch recipes/json_grpo.py                                   # CPU default, offline
    accelerate launch recipes/json_grpo.py --max_steps 50 --learning_rate 5e-6
"""

import sys
from pathlib import Path

from grpo_recipes.run.runner import main

if __name__ == "__main__":
    sys.exit(main("json", default_config=Path(__file__).parent / "configs" / "json_cpu.yaml"))
