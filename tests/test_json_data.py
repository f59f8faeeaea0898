"""The committed JSON extraction data: rebuildable, disjoint, and every gold object valid under its schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema.validators import validator_for

from grpo_recipes.tasks.json_rows import DOMAINS, build_splits, main

DATA = Path(__file__).resolve().parent.parent / "recipes" / "data"


def read(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text(encoding="utf-8").splitlines()]


TRAIN, EVAL = read("json_train.jsonl"), read("json_eval.jsonl")


def test_committed_files_are_what_the_generator_builds(tmp_path):
    assert main(["--out", str(tmp_path)]) == 0
    for name in ("json_train.jsonl", "json_eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), f"rebuild {name}: see tasks/json_tasks.py"


def test_sizes_and_columns():
    assert (len(TRAIN), len(EVAL)) == (300, 60)
    for row in TRAIN + EVAL:
        assert set(row) == {"id", "domain", "question", "text", "schema", "gold"}
    assert {r["domain"] for r in TRAIN} == {r["domain"] for r in EVAL} == set(DOMAINS)


@pytest.mark.parametrize("key", ["id", "question", "text", "gold"])
def test_train_and_eval_are_disjoint(key):
    train = {r[key] for r in TRAIN}
    assert len(train) == len(TRAIN), f"duplicate {key} within train"
    assert not train & {r[key] for r in EVAL}


def test_every_gold_validates_against_its_schema():
    for row in TRAIN + EVAL:
        schema = json.loads(row["schema"])
        cls = validator_for(schema)
        cls.check_schema(schema)
        errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(json.loads(row["gold"])))
        assert not errors, (row["id"], errors[0].message)


def test_question_carries_schema_and_text_and_text_carries_the_values():
    for row in TRAIN + EVAL:
        assert row["schema"] in row["question"] and row["text"] in row["question"]
        for key, value in json.loads(row["gold"]).items():
            # Dates are written out in words and currencies as symbols: the model converts those two.
            if isinstance(value, str) and key not in ("date", "currency"):
                assert value in row["text"], (row["id"], value)


def test_other_sizes_and_seeds_stay_disjoint():
    train, held_out = build_splits(40, 10, seed=7)
    assert len(train) == 40 and len(held_out) == 10
    assert not {r["gold"] for r in train} & {r["gold"] for r in held_out}
