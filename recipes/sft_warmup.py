"""SFT warm-up that teaches the answer format before GRPO; its output folder is the GRPO recipe's model.

    accelerate launch recipes/sft_warmup.py                                            # CPU default, offline
    accelerate launch recipes/math_grpo.py --model_name_or_path outputs/sft_math --demonstration_warmup_steps 0
    accelerate launch recipes/sft_warmup.py --sft_format think_boxed --output_dir outputs/sft_think
    accelerate launch recipes/sft_warmup.py --sft_traces_path traces.jsonl             # distilled traces
"""

import sys
from pathlib import Path

from grpo_recipes.sft import main

if __name__ == "__main__":
    sys.exit(main("sft_math", default_config=Path(__file__).parent / "configs" / "sft_math_cpu.yaml"))
