"""`python -m grpo_recipes.cli`: the `grpo-recipes` command without its console script."""

import sys

from . import main

sys.exit(main())
