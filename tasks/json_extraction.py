"""JSON extraction (the json recipe): turn a short text into a record that fits the row's `schema`, graded field by
field against its `gold` record. Rows come from the config's data settings (recipes/data/json_*.jsonl).

Rewards: `json_schema` (the format reward), `json_field_accuracy` (the verifier), and a soft length penalty.
"""

from grpo_recipes.task import Task, task


@task("json_extraction")
class JsonExtraction(Task):
    defaults = {
        "answer_field": None,  # graded against `schema` and `gold`, not a single answer
        "rewards": [{"name": "json_schema", "weight": 1.0}, {"name": "json_field_accuracy", "weight": 1.0},
                    {"name": "overlong_penalty", "weight": 0.2,
                     "params": {"max_completion_len": 128, "soft_punish_cache": 32}}],
        "correctness_reward": "json_field_accuracy",
    }
