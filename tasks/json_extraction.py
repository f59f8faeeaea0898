"""JSON extraction (the json recipe): turn a short text into a record that fits the row's `schema`, graded field by
field against its `gold` record. Rows come from the config's data settings (recipes/data/json_*.jsonl); each gets
a `demonstration`, its gold record as the prompt asks for it (one line in a ```json block), which an sft stage
trains on.

Rewards: `json_field_accuracy` (the verifier), 0.1 x `json_schema` (the format reward) and a soft length penalty. The
format reward weighs a tenth of the verifier: at equal weight, a schema-valid placeholder that extracts nothing
(`{"name": "x", "age": 0, ...}`) earned half the maximum; at 0.1 it earns less than a quarter on the recipe's rows,
even one holding each field's most common gold value (tests/test_json_recipe.py), and one right field pays more.
"""

import json

from grpo_recipes.tasks import Task, task


@task("json_extraction")
class JsonExtraction(Task):
    defaults = {
        "answer_field": None,  # graded against `schema` and `gold`, not a single answer
        "rewards": [{"name": "json_schema", "weight": 0.1}, {"name": "json_field_accuracy", "weight": 1.0},
                    {"name": "overlong_penalty", "weight": 0.2,
                     "params": {"max_completion_len": 128, "soft_punish_cache": 32}}],
        "correctness_reward": "json_field_accuracy",
        "demonstration_field": "demonstration",
    }

    def prepare(self, row, recipe):
        gold = json.loads(row["gold"]) if isinstance(row.get("gold"), str) else row.get("gold")
        if gold is None:
            return row
        return {**row, "demonstration": f"```json\n{json.dumps(gold, ensure_ascii=False)}\n```"}
