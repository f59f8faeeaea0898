"""Any recipe from its YAML, such as a task of your own (docs/tasks.md); the Trackio project is named after its task.

    accelerate launch recipes/train.py --config my_task.yaml
"""

import sys

from grpo_recipes.run.runner import main

if __name__ == "__main__":
    sys.exit(main(None))
