"""JSON rewards: extraction, schema partial credit, field accuracy and their metrics."""

from __future__ import annotations

import json
import sys

import pytest

from grpo_recipes.rewards.registry import available
from grpo_recipes.tasks.json_rows import build_rows

REWARDS = available()
JSON = sys.modules[REWARDS["json_schema"].func.__module__]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                   "email": {"type": "string", "format": "email"},
                   "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "email"],
    "additionalProperties": False,
}


def run(name: str, completions: list[str], column: list) -> tuple[list, dict]:
    metrics = {}
    out = REWARDS[name].func(completions, column, log_metric=metrics.__setitem__)
    return out, metrics


@pytest.mark.parametrize("text, expected", [
    ('```json\n{"a": 1}\n```', {"a": 1}),
    ('Here: {"a": 1} and then the fix: {"a": 2}', {"a": 2}),                      # the last object wins
    ('{"a": 1} then a broken one {"a": }', None),                                   # a broken last one: none
    ('<think>{"draft": true}</think>\n{"final": true}', {"final": True}),         # reasoning is not the answer
    ('<think>{"draft": true}', None),                                               # unclosed: no answer yet
    ('{"s": "a } brace and a \\" quote {"}', {"s": 'a } brace and a " quote {'}),  # braces inside strings
    ('He said "hi" {"a": [1, {"b": 2}]}', {"a": [1, {"b": 2}]}),                    # quotes in prose
    ("[1, 2]", None),
    ("no json here", None),
    ("{" * 5000 + "}" * 5000, None),                                                # too deep for json: no object
    ('{"a": 1e999}', None), ('{"a": -1e999}', None),                                # Infinity spelled as a number
    ('{"a": 1' + "0" * 400 + "}", None),                                            # beyond any float
    ('{"a": 1.5e3, "b": 12}', {"a": 1500.0, "b": 12}),
    ('[{"a": 1}]', None), ('```json\n[\n  {"a": 1}\n]\n```', None),                # an array is not the record
    ('{"a": 1}\nor rather [{"a": 2}]', None),                                        # ...and it is the last value
    ('[[{"a": 1}]] then {"b": 2}', {"b": 2}), ('see [1] and {"a": 1}', {"a": 1}),
])
def test_extract_json_object(text, expected):
    assert JSON.extract_json_object(text) == expected


def test_schema_reward_gives_partial_credit_in_order():
    good = {"name": "Ada", "age": 36, "email": "ada@example.org"}
    texts = [
        json.dumps(good),
        json.dumps({**good, "extra": 1}),             # all required fields fine, but additionalProperties
        json.dumps({**good, "age": -1}),              # one of three required fields invalid
        json.dumps({"name": "Ada"}),                  # one of three present
        json.dumps({"unrelated": True}),
        "no json",
    ]
    out, metrics = run("json_schema", texts, [SCHEMA] * len(texts))
    assert out[0] == 1.0 and out[-1] == 0.0
    assert out[1] == pytest.approx(0.9)
    assert out[2] == pytest.approx(0.1 + 0.8 * 2 / 3)
    assert out[3] == pytest.approx(0.1 + 0.8 / 3)
    assert out[4] == pytest.approx(0.1)
    assert metrics["parse_rate"] == pytest.approx(5 / 6)
    assert metrics["schema_valid_rate"] == pytest.approx(1 / 6)


def test_schema_reward_checks_formats_and_accepts_schema_as_text():
    texts = ['{"name": "A", "age": 1, "email": "not-an-email"}', '{"name": "A", "age": 1, "email": "a@b.org"}']
    out, _ = run("json_schema", texts, [json.dumps(SCHEMA)] * 2)
    assert out[0] < 1.0 and out[1] == 1.0


def test_schema_reward_gives_none_for_unusable_schemas():
    out, metrics = run("json_schema", ['{"a": 1}'] * 3, ["not json", {"type": "nonsense"}, SCHEMA])
    assert out[:2] == [None, None] and out[2] == pytest.approx(0.1)
    assert metrics["schema_unusable"] == pytest.approx(2 / 3)


def test_field_accuracy_normalises_strings_and_numbers():
    gold = {"name": "Ada Lovelace", "age": 36, "price": 2.5, "online": False, "tags": ["a", "b"]}
    texts = [
        '{"name": "  ada   LOVELACE ", "age": 36.0, "price": 2.50, "online": false, "tags": ["A", "b"]}',
        '{"name": "Ada", "age": "36", "price": 2.5, "online": 0, "tags": ["b", "a"]}',
        "nothing",
    ]
    out, metrics = run("json_field_accuracy", texts, [json.dumps(gold)] * 3)
    assert out == [1.0, pytest.approx(1 / 5), 0.0]  # "36" is not 36, 0 is not false, order of a list matters
    assert metrics["parse_rate"] == pytest.approx(2 / 3)


def test_field_accuracy_gives_none_for_unusable_gold():
    out, metrics = run("json_field_accuracy", ['{"a": 1}'] * 4, ["not json", "[]", "{}", '{"a": 1}'])
    assert out == [None, None, None, 1.0]
    assert metrics["gold_unusable"] == pytest.approx(3 / 4)


def test_gold_in_an_array_and_infinite_numbers_earn_nothing():
    rows = build_rows(8, seed=3)
    wrapped = [json.dumps([json.loads(r["gold"])]) for r in rows]
    assert run("json_schema", wrapped, [r["schema"] for r in rows])[0] == [0.0] * 8
    assert run("json_field_accuracy", wrapped, [r["gold"] for r in rows])[0] == [0.0] * 8
    infinite = ['{"name": "Ada", "age": 1e999, "email": "ada@example.org"}']
    assert run("json_schema", infinite, [SCHEMA])[0] == [0.0]
    assert run("json_field_accuracy", ['{"age": 1' + "0" * 400 + "}"], ['{"age": 36}'])[0] == [0.0]  # raised before


def test_dataset_gold_scores_full_marks_on_both_rewards():
    rows = build_rows(12, seed=3)
    answers = [f"<think>\nreading\n</think>\n```json\n{r['gold']}\n```" for r in rows]
    assert run("json_schema", answers, [r["schema"] for r in rows])[0] == [1.0] * 12
    assert run("json_field_accuracy", answers, [r["gold"] for r in rows])[0] == [1.0] * 12


# ---- issue 46: the last record decides, as the last box does for math; what a reader does not see is not read


def _cut_off(text: str) -> str:
    return text[: text.rindex(",")]


def _aborted_then(record: str) -> str:
    key, value = next(iter(json.loads(record).items()))
    return f"{{{json.dumps(key)}: {json.dumps(value)},\nLet me start again.\n```json\n{record}\n```"


def test_issue46_hidden_cut_off_broken_or_retracted_records_are_no_answer():
    rows = build_rows(12, seed=3)
    wrong = ['{"name": "zzz", "age": -12345, "email": "zzz"}'] * len(rows)
    forms = {
        "gold in an HTML comment": lambda g, w: f"{w}\n<!-- {g} -->",
        "gold, then a record cut off": lambda g, w: f"{g}\nFixed:\n{_cut_off(w)}",
        "gold, then one cut off in a block": lambda g, w: f"{g}\nFixed:\n```json\n{_cut_off(w)}\n```",
        "gold, then a broken record": lambda g, w: f"{g}\nFixed:\n{w[:-1]}, }}",
        "gold, then a Python dict": lambda g, w: f"{g}\nFixed: {{'name': 'zzz'}}",
        "gold, then a prose retraction": lambda g, w: f"{g}\nActually, that record is wrong.",
        "gold, then 'That is not correct.'": lambda g, w: f"{g}\nThat is not correct.",
        "gold struck out": lambda g, w: f"{w}\n<del>{g}</del>",
    }
    for form, build in forms.items():
        texts = [build(r["gold"], w) for r, w in zip(rows, wrong)]
        assert run("json_field_accuracy", texts, [r["gold"] for r in rows])[0] == [0.0] * len(rows), form


def test_issue46_an_aborted_start_and_a_repeated_key_with_one_value_are_read():
    rows = build_rows(12, seed=3)
    for texts in ([_aborted_then(r["gold"]) for r in rows],
                  ["{" + f'"{k}": {json.dumps(v)}, ' + r["gold"][1:] for r in rows
                   for k, v in [next(iter(json.loads(r["gold"]).items()))]]):
        assert run("json_schema", texts, [r["schema"] for r in rows])[0] == [1.0] * len(rows), texts[0]
        assert run("json_field_accuracy", texts, [r["gold"] for r in rows])[0] == [1.0] * len(rows), texts[0]
    # A key given two different values is still unreadable, and prose braces after a record do not hide it.
    assert JSON.extract_json_object('{"a": 1, "a": 2}') is None
    assert JSON.extract_json_object('{"a": 1}\nNote: fields use {braces}; see \\boxed{x}.') == {"a": 1}


def test_issue46_a_string_cut_by_a_line_break_hides_nothing_after_it():
    assert JSON.extract_json_object('{"name": "Ad\nLet me start again.\n{"name": "Ada"}') == {"name": "Ada"}
