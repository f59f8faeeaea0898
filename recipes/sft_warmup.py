"""A run of one `sft` stage that teaches the answer format; its output folder can be a GRPO recipe's model.

    accelerate launch recipes/sft_warmup.py                                            # CPU default, offline
    accelerate launch recipes/math_grpo.py --model_name_or_path outputs/sft_math --stages '["grpo"]'
    accelerate launch recipes/sft_warmup.py --sft_format think_boxed --output_dir outputs/sft_think
    accelerate launch recipes/sft_warmup.py --sft_traces_path traces.jsonl             # distilled traces
"""

import sys
from pathlib import Path

from grpo_recipes.run.runner import main

if __name__ == "__main__":
    sys.exit(main("sft_math", default_config=Path(__file__).parent / "configs" / "sft_math_cpu.yaml"))
