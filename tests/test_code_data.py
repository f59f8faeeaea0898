"""Code tasks: the procedural generator, the committed training file, and HumanEval loading."""

import json
import re

from helpers import REPO

from grpo_recipes.sandbox import Job, run_many
from grpo_recipes.tasks.code_rows import generate_code_tasks
from grpo_recipes.tasks.humaneval import load_humaneval

COMMITTED = REPO / "recipes/data/code_train.jsonl"


def test_generation_is_deterministic_and_seeded():
    assert generate_code_tasks(40, seed=3) == generate_code_tasks(40, seed=3)
    assert generate_code_tasks(40, seed=3) != generate_code_tasks(40, seed=4)


def test_committed_file_is_the_generator_output():
    rows = [json.loads(line) for line in COMMITTED.read_text(encoding="utf-8").splitlines()]
    assert rows == generate_code_tasks(300, seed=0), "regenerate: python -m grpo_recipes.tasks.code_rows --n 300 --seed 0"


def test_rows_are_well_formed_varied_and_distinct():
    rows = generate_code_tasks(300, seed=0)
    assert len({r["question"] for r in rows}) == 300
    assert len({r["entry_point"] for r in rows}) >= 30  # many families and names, not one task 300 times
    for row in rows:
        name = row["entry_point"]
        assert set(row) == {"id", "question", "tests", "entry_point", "canonical_solution"}
        assert 3 <= len(row["tests"]) <= 5 and len(set(row["tests"])) == len(row["tests"])
        assert all(t.startswith(f"assert {name}(") for t in row["tests"])
        assert f"`{name}(" in row["question"] and "```python" in row["question"]
        example = re.search(r"For example, `(.+)` should return", row["question"]).group(1)
        assert all(example not in t for t in row["tests"])  # the example given is not one of the tests


def test_reference_solutions_pass_and_wrong_ones_fail_in_the_sandbox():
    rows = generate_code_tasks(300, seed=0)
    good = run_many(Job(r["canonical_solution"], tuple(r["tests"])) for r in rows)
    assert [r["id"] for r, res in zip(rows, good) if res.status != "ok"] == []
    wrong = run_many(Job(f"def {r['entry_point']}(*args):\n    return None\n", tuple(r["tests"])) for r in rows)
    assert sum(res.status == "ok" for res in wrong) == 0


def test_humaneval_rows():
    rows = load_humaneval()
    assert len(rows) == 164 and len(load_humaneval(limit=5)) == 5
    first = rows[0]
    assert first["entry_point"] == "has_close_elements"
    assert first["tests"][0].rstrip().endswith("check(has_close_elements)")
    assert first["prompt"] in first["question"] and "```python" in first["question"]
    assert first["canonical_solution"].startswith(first["prompt"])
