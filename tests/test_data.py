"""Data sources -> disjoint train/held-out splits of chat prompts."""

import json

import pytest
from transformers import AutoTokenizer

from grpo_recipes.config.schema import RecipeArguments
from grpo_recipes.tasks.data import check_data_args, load_splits, question_key, split_rows


def args(**kw):
    base = dict(gym_params={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, train_size=200,
                eval_size=30)
    return RecipeArguments(**{**base, **kw})


def questions(ds):
    return {question_key(q) for q in ds["question"]}


def test_reasoning_gym_splits_are_disjoint_and_chat_formatted():
    a = args(prompt_template="{question} Answer in \\boxed{{}}.", system_prompt="Be brief.")
    train, held = load_splits(a, None)
    assert len(held) == 30 and 0 < len(train) <= 200
    assert not questions(train) & questions(held)
    row = train[0]
    assert row["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert row["prompt"][1]["role"] == "user" and row["prompt"][1]["content"].endswith("Answer in \\boxed{}.")
    assert json.loads(row["gym_entry"])["answer"] == row["answer"]


def test_empty_system_prompt_replaces_the_templates_default_and_none_keeps_it(smollm_tokenizer_dir):
    """SmolLM2's chat template inserts its own 16-token system message when the prompt has none; "" must send an
    empty one instead (the math default's shorter prompt), and null must leave the template's default in place."""
    tok = AutoTokenizer.from_pretrained(smollm_tokenizer_dir)
    empty, default = (load_splits(args(system_prompt=s), None)[0][0]["prompt"] for s in ("", None))
    assert empty[0] == {"role": "system", "content": ""} and default[0]["role"] == "user"
    text = {k: tok.apply_chat_template(p, tokenize=False) for k, p in (("empty", empty), ("default", default))}
    assert "named SmolLM" in text["default"] and "named SmolLM" not in text["empty"]
    assert text["empty"].startswith("<|im_start|>system\n<|im_end|>")


def test_split_is_deterministic_per_seed():
    a, b = load_splits(args(), None), load_splits(args(), None)
    assert a[1]["question"] == b[1]["question"]
    c = load_splits(args(split_seed=1), None)
    assert c[1]["question"] != a[1]["question"]


def test_repeated_questions_never_straddle_the_split():
    rows = [{"question": f"q{i % 7}", "answer": str(i)} for i in range(100)]
    rows += [{"question": "  Q3 ", "answer": "x"}]  # same question after normalisation
    train, held = split_rows(rows, None, args(eval_size=3))
    held_keys = {question_key(r["question"]) for r in held}
    assert len(held) == 3 and all(question_key(r["question"]) not in held_keys for r in train)


def test_given_eval_source_removes_its_questions_from_training():
    rows = [{"question": f"q{i}", "answer": "1"} for i in range(20)]
    eval_rows = [{"question": "q3", "answer": "1"}, {"question": "q4", "answer": "1"}]
    train, held = split_rows(rows, eval_rows, args(eval_size=10))
    assert [r["question"] for r in held] == ["q3", "q4"]
    assert {"q3", "q4"}.isdisjoint(r["question"] for r in train) and len(train) == 18


def test_file_source_keeps_columns_and_extracts_answers(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps({"problem": f"What is {i}+{i}?", "solution": f"so\n#### {2 * i}",
                                          "tests": ["assert True"]}) for i in range(40)))
    a = args(dataset_source="file", dataset_path=str(path), question_field="problem", answer_field="solution",
             answer_regex=r"#### (.*)$", eval_size=5, train_size=100)
    assert check_data_args(a) == []
    train, held = load_splits(a, None)
    assert len(held) == 5 and len(train) == 35
    row = held[0]
    assert row["answer"] == str(2 * int(row["question"].split()[2].split("+")[0]))
    assert row["tests"] == ["assert True"]


def test_bad_data_settings_are_named():
    problems = check_data_args(args(dataset_source="hf", prompt_template="no placeholder", answer_regex="(", eval_size=-1))
    text = "\n".join(problems)
    for field in ("dataset_source", "prompt_template", "answer_regex", "eval_size"):
        assert field in text
    assert any("dataset_path: required" in p for p in check_data_args(args(dataset_source="file")))
    assert any("gym_task" in p for p in check_data_args(args(gym_task="no_such_task")))


def test_missing_question_column_names_the_field(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"q": "x", "answer": "1"}) + "\n")
    with pytest.raises(KeyError, match="question_field"):
        load_splits(args(dataset_source="file", dataset_path=str(path)), None)


def test_few_shot_examples_become_earlier_turns_and_must_not_be_held_out():
    shots = [{"question": "Calculate 2 + 5.", "completion": "2 + 5 = 7. \\boxed{7}"}]
    a = args(prompt_template="{question} Box it.", system_prompt="Be brief.", few_shot=json.dumps(shots))
    train, held = load_splits(a, None)
    for prompt, question in ((train[0]["prompt"], train[0]["question"]), (held[0]["prompt"], held[0]["question"])):
        assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
        assert prompt[1]["content"] == "Calculate 2 + 5. Box it." and prompt[2]["content"] == shots[0]["completion"]
        assert prompt[3]["content"] == f"{question} Box it."
    # An example whose question is held out would be scored with its answer in the prompt: refused, by name.
    leaked = [{"question": held[0]["question"], "completion": "x"}]
    with pytest.raises(ValueError, match=r"few_shot: the example question\(s\) .* are held-out questions"):
        load_splits(args(few_shot=leaked), None)
    with pytest.raises(ValueError, match=r"few_shot\[0\]: expected a mapping with string `question` and `completion`"):
        args(few_shot=[{"question": "q"}])
